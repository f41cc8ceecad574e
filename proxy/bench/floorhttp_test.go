package bench

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHTTPFloor: the fasthttp floor relays a non-stream answer and a
// paced stream on one keep-alive connection, every event intact and in
// its own time (not held to the end), and stops when its listener closes.
func TestHTTPFloor(t *testing.T) {
	e, err := NewEmitter(300)
	require.NoError(t, err)
	defer e.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- RunHTTPFloor(ln, e.Addr(), 16) }()
	cc, err := dialClient(ln.Addr().String(), clientBufSize)
	require.NoError(t, err)
	defer cc.Close()

	_, err = runSmall(cc, ln.Addr().String(), appendSmallRequest(nil, 0, 0))
	require.NoError(t, err)
	s := newEventScanner(300)
	const events, gap = 30, 20 * time.Millisecond
	tally, ttfb, err := runStream(cc, ln.Addr().String(), s, appendStreamRequest(nil, events, gap, 0, 1), events)
	require.NoError(t, err)
	require.True(t, tally.ok(), "%+v", tally)
	require.Equal(t, int64(events), tally.Events)
	require.Less(t, ttfb, events*gap/2, "the stream's head and first event are not held to its end")
	_, err = runSmall(cc, ln.Addr().String(), appendSmallRequest(nil, 0, 2))
	require.NoError(t, err, "the connection is kept alive after a stream")

	require.NoError(t, ln.Close())
	require.NoError(t, <-done)
}
