package sse

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestResetDropsLargeBuffers: after a stream whose one long event (or
// line) came in two reads, Reset keeps no buffer beyond keptBytes, so a
// pooled relay does not pin up to the 1 MiB limit for the next stream;
// short buffers stay for reuse.
func TestResetDropsLargeBuffers(t *testing.T) {
	long := bytes.Repeat([]byte("x"), 300<<10)
	var ev Event

	p := NewParser(0)
	p.Feed(append([]byte("data: "), long[:100<<10]...))
	_, _ = p.Next(&ev)
	p.Feed(append(append([]byte{}, long[100<<10:]...), "\n\n"...))
	ok, err := p.Next(&ev)
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, ev.Data, len(long))
	require.Greater(t, max(cap(p.carry), cap(p.line), cap(p.data)), keptBytes, "the long event was gathered")
	p.Reset()
	for _, b := range [][]byte{p.carry, p.line, p.data, p.typ, p.id} {
		require.LessOrEqual(t, cap(b), keptBytes)
	}

	l := NewLines(0)
	l.Feed(long[:100<<10])
	_, _ = l.Next(&ev)
	l.Feed(append(append([]byte{}, long[100<<10:]...), '\n'))
	ok, err = l.Next(&ev)
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, ev.Data, len(long))
	require.Greater(t, cap(l.line), keptBytes, "the long line was gathered")
	l.Reset()
	require.LessOrEqual(t, cap(l.line), keptBytes)
	require.LessOrEqual(t, cap(l.carry), keptBytes)

	short := NewLines(0)
	short.Feed([]byte(`{"a":`))
	_, _ = short.Next(&ev)
	short.Feed([]byte("1}\n"))
	_, _ = short.Next(&ev)
	c := cap(short.line)
	short.Reset()
	require.Equal(t, c, cap(short.line), "a short buffer is kept")
}
