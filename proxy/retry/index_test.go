package retry

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAging: finished logical requests are dropped a Window after their
// last activity; one still in flight is kept.
func TestAging(t *testing.T) {
	tr, clk := newTest(t, Config{Window: time.Minute})
	for i := range 10 {
		r := tr.Begin(req(fmt.Sprint(i), -1))
		if i > 0 {
			tr.End(&r, status(200))
		}
		clk.advance(time.Second)
	}
	require.Equal(t, 10, tr.Stats().Entries)
	clk.advance(time.Minute)
	tr.Begin(Request{Body: []byte("other client")})
	s := tr.Stats()
	require.Equal(t, 2, s.Entries, "the new one and the one in flight")
	require.EqualValues(t, 9, s.Expired)
	require.Equal(t, 1, s.Clients, "the idle client went too")

	r := tr.Begin(req("0", -1))
	require.Equal(t, EndingInFlight, r.PrevOutcome)
}

// TestMemoryCap: a flood of distinct bodies, from one client and from many,
// never takes the index past MaxBytes; the least recently used go first.
func TestMemoryCap(t *testing.T) {
	const maxBytes = 256 << 10
	for _, manyClients := range []bool{false, true} {
		t.Run(fmt.Sprint("many clients ", manyClients), func(t *testing.T) {
			tr, clk := newTest(t, Config{MaxBytes: maxBytes})
			r := req("", -1)
			body := make([]byte, 64)
			for i := range 20_000 {
				binary.LittleEndian.PutUint64(body, uint64(i))
				r.Body = body
				if manyClients {
					r.UserAgent = body[:8]
				}
				res := tr.Begin(r)
				tr.End(&res, status(200))
				clk.advance(time.Millisecond)
				if i%1000 == 0 {
					require.LessOrEqual(t, tr.Stats().Bytes, int64(maxBytes))
				}
			}
			s := tr.Stats()
			require.LessOrEqual(t, s.Bytes, int64(maxBytes))
			require.Greater(t, s.Bytes, int64(maxBytes)*3/4, "the budget is used")
			require.Positive(t, s.Evicted)
			if manyClients {
				require.Positive(t, s.EvictedClients)
			}

			// The most recent body is still known; the first is gone.
			r.Body = body
			require.True(t, tr.Begin(r).Retry)
			binary.LittleEndian.PutUint64(body, 0)
			if manyClients {
				r.UserAgent = body[:8]
			}
			require.False(t, tr.Begin(r).Retry)
		})
	}
}

// TestRollingAmplification: a logical request is counted once in the
// window however many slots its retries cover, and the window forgets.
func TestRollingAmplification(t *testing.T) {
	tr, clk := newTest(t, Config{Window: 10 * time.Second})
	for range 4 { // one logical request, an attempt every 2 s
		r := tr.Begin(req("b", -1))
		tr.End(&r, status(429))
		clk.advance(2 * time.Second)
	}
	r := tr.Begin(req("other", -1))
	tr.End(&r, status(200))
	s := tr.Stats()
	require.Equal(t, [3]int64{5, 2, 3}, [3]int64{s.WindowAttempts, s.WindowLogical, s.WindowRetries})
	require.Equal(t, 2.5, s.Amplification)

	clk.advance(5 * time.Second) // the first two attempts leave the window
	s = tr.Stats()
	require.Equal(t, [2]int64{3, 2}, [2]int64{s.WindowAttempts, s.WindowLogical})

	clk.advance(10 * time.Second)
	s = tr.Stats()
	require.Equal(t, [3]int64{0, 0, 0}, [3]int64{s.WindowAttempts, s.WindowLogical, s.WindowRetries})
	require.Zero(t, s.Amplification)
	require.EqualValues(t, 5, s.Attempts, "cumulative counts stay")
	require.Empty(t, tr.TopClients(5))
}

func TestTopClients(t *testing.T) {
	tr, _ := newTest(t, Config{})
	retrier, calm := req("b", -1), req("b", -1)
	calm.Auth = []byte("Bearer sk-calm")
	for i := range 6 {
		r := tr.Begin(retrier)
		tr.End(&r, status(429))
		calm.Body = fmt.Appendf(nil, "c%d", i)
		r = tr.Begin(calm)
		tr.End(&r, status(200))
	}
	top := tr.TopClients(5)
	require.Len(t, top, 2)
	id := tr.Begin(retrier).ClientID
	require.Equal(t, ClientStat{ClientID: id, Attempts: 6, Logical: 1, Retries: 5, Amplification: 6}, top[0])
	require.Equal(t, ClientStat{ClientID: tr.Begin(calm).ClientID, Attempts: 6, Logical: 6, Amplification: 1}, top[1])
	require.Len(t, tr.TopClients(1), 1)
	require.Nil(t, tr.TopClients(0))
}
