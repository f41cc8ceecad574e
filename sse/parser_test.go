package sse

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// render prints an event compactly, leaving out defaults, so that tables and
// diffs stay readable.
func render(ev *Event) string {
	var b strings.Builder
	if len(ev.Type) > 0 {
		fmt.Fprintf(&b, "event=%q ", ev.Type)
	}
	fmt.Fprintf(&b, "data=%q", ev.Data)
	if ev.ID != nil {
		fmt.Fprintf(&b, " id=%q", ev.ID)
	}
	if ev.Retry >= 0 {
		fmt.Fprintf(&b, " retry=%d", ev.Retry)
	}
	return b.String()
}

// span is the raw byte range of one event.
type span struct{ off, end int64 }

// parsed is everything a Parser produced from one stream.
type parsed struct {
	out     []string // rendered events and errors, in order
	spans   []span
	pending int
}

// parse feeds chunks to a new Parser with the given limit.
func parse(max int, chunks ...[]byte) parsed {
	p := NewParser(max)
	var r parsed
	var ev Event
	for _, c := range chunks {
		p.Feed(c)
		for {
			ok, err := p.Next(&ev)
			if err != nil {
				r.out = append(r.out, "error: "+err.Error())
				continue
			}
			if !ok {
				break
			}
			r.out = append(r.out, render(&ev))
			r.spans = append(r.spans, span{ev.Offset, ev.Offset + int64(ev.Len)})
		}
	}
	r.pending = p.Pending()
	return r
}

// bytewise splits in into one-byte chunks.
func bytewise(in []byte) [][]byte {
	chunks := make([][]byte, len(in))
	for i := range in {
		chunks[i] = in[i : i+1]
	}
	return chunks
}

// requireTiles checks that the event ranges cover the first n bytes of the
// stream exactly, in order, without gaps.
func requireTiles(t testing.TB, spans []span, n int) {
	t.Helper()
	var at int64
	for i, s := range spans {
		require.Equal(t, at, s.off, "event %d starts at a gap or an overlap", i)
		require.Greater(t, s.end, s.off, "event %d is empty", i)
		at = s.end
	}
	require.Equal(t, int64(n), at, "ranges do not reach len(input)-Pending")
}

// requireSplitInvariant parses in whole and split at k and requires the same
// events. The ranges must tile the input both times and be equal, except
// when k falls inside a CRLF pair: the Parser dispatches at the CR without
// waiting for the next chunk, so the LF then opens the next range.
func requireSplitInvariant(t testing.TB, in []byte, k, max int) {
	t.Helper()
	whole := parse(max, in)
	split := parse(max, in[:k], in[k:])
	require.Equal(t, whole.out, split.out, "split at %d", k)
	requireTiles(t, whole.spans, len(in)-whole.pending)
	requireTiles(t, split.spans, len(in)-split.pending)
	if 0 < k && k < len(in) && in[k-1] == '\r' && in[k] == '\n' {
		return
	}
	require.Equal(t, whole.spans, split.spans, "split at %d", k)
	require.Equal(t, whole.pending, split.pending, "split at %d", k)
}

// whatwgTests are the parsing rules of WHATWG HTML "Server-sent events",
// sections "Parsing an event stream" and "Interpreting an event stream",
// with the examples of the spec.
var whatwgTests = []struct {
	name    string
	in      string
	want    []string
	pending int
}{
	{name: "LF", in: "data: a\n\n", want: []string{`data="a"`}},
	{name: "CRLF", in: "data: a\r\n\r\n", want: []string{`data="a"`}},
	{name: "CR", in: "data: a\r\r", want: []string{`data="a"`}},
	{name: "mixed line ends", in: "data: a\r\ndata: b\rdata: c\n\n", want: []string{`data="a\nb\nc"`}},
	{name: "CR then LF is one line end", in: "data: a\r\n\ndata: b\r\r\n", want: []string{`data="a"`, `data="b"`}},
	{name: "LF then CR is two", in: "data: a\n\r", want: []string{`data="a"`}},
	{
		name: "multi-line data",
		in:   "data: YHOO\ndata: +2\ndata: 10\n\n",
		want: []string{`data="YHOO\n+2\n10"`},
	},
	{
		name: "comments and ids",
		in:   ": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n",
		want: []string{`data="first event" id="1"`, `data="second event" id=""`, `data=" third event"`},
	},
	{
		name: "event types",
		in:   "event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\nevent: add\ndata: 113411\n\n",
		want: []string{`event="add" data="73857293"`, `event="remove" data="2153"`, `event="add" data="113411"`},
	},
	{
		name:    "fields without colon",
		in:      "data\n\ndata\ndata\n\ndata:",
		want:    []string{`data=""`, `data="\n"`},
		pending: 5,
	},
	{name: "no space after colon", in: "data:test\n\ndata: test\n\n", want: []string{`data="test"`, `data="test"`}},
	{name: "only one space is removed", in: "data:  x\ndata:\ty\n\n", want: []string{`data=" x\n\ty"`}},
	{name: "colon in value", in: "data: a: b\n\n", want: []string{`data="a: b"`}},
	{name: "empty data", in: "data:\n\n", want: []string{`data=""`}},
	{name: "field names are case-sensitive", in: "Data: x\n\n", want: nil, pending: 9},
	{name: "unknown field", in: "foo: bar\ndata: x\n\n", want: []string{`data="x"`}},
	{name: "blank line without data resets type", in: "event: a\n\ndata: x\n\n", want: []string{`data="x"`}},
	{name: "blank line without data drops id and retry", in: "id: 7\nretry: 5\n\ndata: x\n\n", want: []string{`data="x"`}},
	{name: "id is per event", in: "id: 1\ndata: a\n\ndata: b\n\n", want: []string{`data="a" id="1"`, `data="b"`}},
	{name: "id with NUL is ignored", in: "id: 1\nid: a\x00b\ndata: x\n\n", want: []string{`data="x" id="1"`}},
	{name: "last id wins", in: "id: 1\nid: 2\ndata: x\n\n", want: []string{`data="x" id="2"`}},
	{name: "retry", in: "retry: 1000\ndata: x\n\n", want: []string{`data="x" retry=1000`}},
	{name: "retry not digits", in: "retry: 10a\nretry: -5\nretry: 1.5\nretry:\ndata: x\n\n", want: []string{`data="x"`}},
	{name: "invalid retry keeps valid one", in: "retry: 10\nretry: x\ndata: x\n\n", want: []string{`data="x" retry=10`}},
	{name: "huge retry saturates", in: "retry: 99999999999999999999999\ndata: x\n\n", want: []string{`data="x" retry=9223372036854775807`}},
	{name: "BOM", in: "\xEF\xBB\xBFdata: x\n\n", want: []string{`data="x"`}},
	{name: "BOM alone on the first line", in: "\xEF\xBB\xBF\ndata: x\n\n", want: []string{`data="x"`}},
	{name: "only one BOM is skipped", in: "\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n", want: nil, pending: 15},
	{name: "BOM later is data", in: "data: x\n\n\xEF\xBB\xBFdata: y\n\n", want: []string{`data="x"`}, pending: 12},
	{name: "partial BOM", in: "\xEF\xBBdata: x\n\n", want: nil, pending: 11},
	{name: "event at EOF stays pending", in: "data: x\n", want: nil, pending: 8},
	{name: "partial line stays pending", in: "data: x\n\ndata: y", want: []string{`data="x"`}, pending: 7},
	{name: "trailing comment is pending", in: "data: x\n\n: keep-alive\n\n", want: []string{`data="x"`}, pending: 14},
	{name: "trailing CR is a line end", in: "data: x\n\r", want: []string{`data="x"`}},
	{name: "empty stream", in: "", want: nil},
	{name: "blank lines only", in: "\n\n\r\n\r", want: nil, pending: 5},
	{name: "whitespace is not blank", in: " \n\n", want: nil, pending: 3},
	{name: "UTF-8 passes through", in: "data: héllo 👋\n\n", want: []string{`data="héllo 👋"`}},
}

func TestParserWHATWG(t *testing.T) {
	for _, tt := range whatwgTests {
		t.Run(tt.name, func(t *testing.T) {
			got := parse(0, []byte(tt.in))
			require.Equal(t, tt.want, got.out)
			require.Equal(t, tt.pending, got.pending)
			requireTiles(t, got.spans, len(tt.in)-got.pending)
		})
	}
}

// streamFiles returns the recorded streams in testdata.
func streamFiles(t testing.TB) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob("testdata/*.sse")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	files := make(map[string][]byte, len(names))
	for _, name := range names {
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		files[filepath.Base(name)] = b
	}
	return files
}

func TestParserSplitAnywhere(t *testing.T) {
	inputs := map[string][]byte{}
	for _, tt := range whatwgTests {
		inputs[tt.name] = []byte(tt.in)
	}
	for name, b := range streamFiles(t) {
		inputs[name] = b
		inputs[name+" CRLF"] = bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))
		inputs[name+" CR"] = bytes.ReplaceAll(b, []byte("\n"), []byte("\r"))
	}
	for name, in := range inputs {
		t.Run(name, func(t *testing.T) {
			// Every offset of the first 512 bytes, then every 13th: what
			// matters is where in a line a split falls, and a stride keeps
			// this quadratic test fast under -race.
			for k := 0; k <= len(in); k += 1 + k/512*12 {
				requireSplitInvariant(t, in, k, 0)
				requireSplitInvariant(t, in, k, 64)
			}
			whole, single := parse(0, in), parse(0, bytewise(in)...)
			require.Equal(t, whole.out, single.out)
			requireTiles(t, single.spans, len(in)-single.pending)
		})
	}
}

func TestParserRanges(t *testing.T) {
	in := ": hello\n\nevent: x\n\ndata: a\r\n\r\nid: 1\ndata: b\n\n: tail\n"
	got := parse(0, []byte(in))
	require.Equal(t, []string{`data="a"`, `data="b" id="1"`}, got.out)
	require.Equal(t, []span{{0, 30}, {30, 45}}, got.spans)
	require.Equal(t, len(": tail\n"), got.pending)
	require.Equal(t, "id: 1\ndata: b\n\n", in[30:45])
}

func TestParserTooLarge(t *testing.T) {
	const max = 10
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{name: "at the limit", in: "data: abcd\n\n", want: []string{`data="abcd"`}},
		{name: "one byte over", in: "data: abcde\n\ndata: ok\n\n", want: []string{"error: sse: event too large", `data="ok"`}},
		{name: "line ends do not count", in: "data: ab\r\n\r\n", want: []string{`data="ab"`}},
		{name: "lines add up", in: "data: a\ndata: b\n\ndata: ok\n\n", want: []string{"error: sse: event too large", `data="ok"`}},
		{name: "comments count", in: ": 0123456789\ndata: a\n\ndata: ok\n\n", want: []string{"error: sse: event too large", `data="ok"`}},
		{
			name: "one error per event",
			in:   "data: 0123456789\ndata: 0123456789\ndata: 0123456789\n\ndata: ok\n\n",
			want: []string{"error: sse: event too large", `data="ok"`},
		},
		{
			name: "each event once",
			in:   "data: 0123456789\n\nevent: 0123456789\n\ndata: ok\r\r",
			want: []string{"error: sse: event too large", "error: sse: event too large", `data="ok"`},
		},
		{name: "event without data still counts", in: "event: 0123456789\n\ndata: ok\n\n", want: []string{"error: sse: event too large", `data="ok"`}},
		{name: "the dropped event's type does not leak", in: "event: t\ndata: 0123456789\n\ndata: ok\n\n", want: []string{"error: sse: event too large", `data="ok"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k := 0; k <= len(tt.in); k++ {
				got := parse(max, []byte(tt.in[:k]), []byte(tt.in[k:]))
				require.Equal(t, tt.want, got.out, "split at %d", k)
				requireTiles(t, got.spans, len(tt.in)-got.pending)
			}
		})
	}
}

func TestParserMemoryBounded(t *testing.T) {
	const max = 4 << 10
	p := NewParser(max)
	chunk := bytes.Repeat([]byte("x"), 1000)
	var ev Event
	next := func() (bool, error) { return p.Next(&ev) }

	p.Feed([]byte("data: "))
	for range 10_000 { // a 10 MB line
		p.Feed(chunk)
		for ok, err := next(); ok || err != nil; ok, err = next() {
			require.ErrorIs(t, err, ErrEventTooLarge)
		}
		require.LessOrEqual(t, len(p.line), max)
		require.LessOrEqual(t, len(p.data), max)
	}
	p.Feed([]byte("\n\ndata: ok\n\n"))
	ok, err := p.Next(&ev)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "ok", string(ev.Data))
	require.Equal(t, int64(0), ev.Offset)
	require.Equal(t, 6+10_000*1000+12, ev.Len)
}

// TestParserFeedBeforeDrained calls Next at most once per Feed, so that Feed
// often finds the previous chunk unread and must keep its rest.
func TestParserFeedBeforeDrained(t *testing.T) {
	for name, in := range streamFiles(t) {
		t.Run(name, func(t *testing.T) {
			want := parse(0, in)
			p := NewParser(0)
			var ev Event
			var got parsed
			add := func() {
				got.out = append(got.out, render(&ev))
				got.spans = append(got.spans, span{ev.Offset, ev.Offset + int64(ev.Len)})
			}
			for rest := in; len(rest) > 0; {
				k := min(50, len(rest))
				p.Feed(rest[:k])
				rest = rest[k:]
				if ok, _ := p.Next(&ev); ok {
					add()
				}
			}
			for ok, _ := p.Next(&ev); ok; ok, _ = p.Next(&ev) {
				add()
			}
			require.Equal(t, want.out, got.out)
			require.Equal(t, want.spans, got.spans)
			require.Zero(t, p.Pending())
		})
	}
}

func TestParserReset(t *testing.T) {
	p := NewParser(0)
	var ev Event
	p.Feed([]byte("\xEF\xBB\xBFdata: a\n\nevent: x\ndata: par"))
	ok, _ := p.Next(&ev)
	require.True(t, ok)
	ok, _ = p.Next(&ev)
	require.False(t, ok)
	require.Equal(t, 18, p.Pending())

	p.Reset()
	require.Zero(t, p.Pending())
	p.Feed([]byte("\xEF\xBB\xBFdata: b\n\n"))
	ok, err := p.Next(&ev)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, `data="b"`, render(&ev))
	require.Equal(t, int64(0), ev.Offset)
	require.Equal(t, 12, ev.Len)
}
