package proxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http/httputil"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// decodeSplit feeds body to a chunkDecoder cut at the given points and
// returns the data, whether the body ended, the bytes beyond it and the
// first error.
func decodeSplit(body []byte, cuts []int) (data []byte, done bool, extra int, err error) {
	var d chunkDecoder
	prev := 0
	for _, c := range append(cuts, len(body)) {
		piece := bytes.Clone(body[prev:c])
		prev = c
		n, used, derr := d.decode(piece)
		data = append(data, piece[:n]...)
		extra += len(piece) - used
		if derr != nil {
			return data, d.done(), extra, derr
		}
	}
	return data, d.done(), extra, nil
}

// TestChunkDecoderEverySplit: any chunked body, cut anywhere, decodes to
// what Go's own chunked reader reads, and ends where the body ends.
func TestChunkDecoderEverySplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var body, want bytes.Buffer
		w := httputil.NewChunkedWriter(&body)
		for range rng.IntN(6) {
			b := make([]byte, 1+rng.IntN(300))
			for i := range b {
				b[i] = byte('a' + rng.IntN(26))
			}
			want.Write(b)
			_, _ = w.Write(b)
		}
		_ = w.Close()
		if rng.IntN(2) == 0 {
			body.WriteString("X-Trailer: v\r\n")
		}
		body.WriteString("\r\n")
		raw := body.Bytes()
		cuts := []int{}
		for c := rng.IntN(len(raw) + 1); c < len(raw); c += 1 + rng.IntN(40) {
			cuts = append(cuts, c)
		}
		data, done, extra, err := decodeSplit(raw, cuts)
		require.NoError(t, err)
		require.True(t, done)
		require.Zero(t, extra)
		require.Equal(t, want.String(), string(data))
		ref, err := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(raw)))
		require.NoError(t, err)
		require.Equal(t, string(ref), string(data))
	}
	for cut := range len("5\r\nhello\r\n0\r\n\r\n") {
		data, done, _, err := decodeSplit([]byte("5\r\nhello\r\n0\r\n\r\n"), []int{cut})
		require.NoError(t, err)
		require.True(t, done)
		require.Equal(t, "hello", string(data))
	}
}

// TestChunkDecoderRefuses: the framings fasthttp's reader refuses are
// refused here too, and bytes after the end are reported, not decoded.
func TestChunkDecoderRefuses(t *testing.T) {
	for _, bad := range []string{
		"x\r\n",                  // no size
		"5\nhello\r\n",           // bare LF after the size
		"5;a\nb\r\nhello\r\n",    // a newline inside an extension
		"5 ;ext\r\nhello\r\n",    // whitespace before the extension
		"5\r\nhelloX\r\n",        // data longer than its size
		"5\r\nhello\r\r",         // no LF after the data
		"1000000000000000\r\n",   // 2^60: too large
		"5\r\nhello\r\n0\r\n\rX", // no LF in the final CRLF
	} {
		_, _, _, err := decodeSplit([]byte(bad), nil)
		require.ErrorIs(t, err, errBadChunk, "%q", bad)
	}
	for _, ok := range []string{"5;name=v\r\nhello\r\n0\r\n\r\n", "5 \t\r\nhello\r\n0\r\n\r\n", "A\r\n0123456789\r\n0\r\n\r\n"} {
		_, done, _, err := decodeSplit([]byte(ok), nil)
		require.NoError(t, err, "%q", ok)
		require.True(t, done, "%q", ok)
	}
	data, done, extra, err := decodeSplit([]byte("2\r\nhi\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n"), nil)
	require.NoError(t, err)
	require.True(t, done)
	require.Equal(t, "hi", string(data))
	require.Equal(t, len("HTTP/1.1 200 OK\r\n"), extra)
}

func TestAppendChunkSize(t *testing.T) {
	for _, n := range []int{0, 1, 15, 16, 255, 16 << 10, 1<<31 - 1} {
		got := string(appendChunkSize(nil, n))
		require.True(t, strings.HasSuffix(got, "\r\n"))
		var v int
		for _, c := range strings.TrimSuffix(got, "\r\n") {
			d, ok := unhex(byte(c))
			require.True(t, ok)
			v = v<<4 | int(d)
		}
		require.Equal(t, n, v)
	}
}
