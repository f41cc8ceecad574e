//go:build !race

package retry

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// heapAlloc is the live heap. Two collections: objects in a sync.Pool
// (fmt's, the testing package's) survive the first in its victim cache, and
// counted in a baseline and gone later they made the first test of a run
// read 40 KB short.
func heapAlloc() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestHeapWithinMaxBytes floods a Tracker with distinct bodies, from one
// client and from as many clients, for several times what it holds: the
// heap it keeps stays within MaxBytes and matches Stats.Bytes.
func TestHeapWithinMaxBytes(t *testing.T) {
	for _, maxBytes := range []int64{1e6, 4 << 20} {
		for _, manyClients := range []bool{false, true} {
			t.Run(fmt.Sprint(maxBytes, " many clients ", manyClients), func(t *testing.T) {
				before := heapAlloc()
				tr, _ := newTest(t, Config{MaxBytes: maxBytes})
				r := req("", -1)
				body := make([]byte, 32)
				var peak uint64
				for i := range 200_000 {
					binary.LittleEndian.PutUint64(body, uint64(i))
					r.Body = body
					if manyClients {
						r.UserAgent = body[:8]
					}
					res := tr.Begin(r)
					tr.End(&res, status(200))
					if i%40_000 == 39_999 {
						peak = max(peak, heapAlloc()-before)
					}
				}
				s := tr.Stats()
				t.Logf("peak heap %d B, Stats.Bytes %d B, %d entries, %d clients", peak, s.Bytes, s.Entries, s.Clients)
				require.LessOrEqual(t, s.Bytes, maxBytes)
				require.LessOrEqual(t, peak, uint64(maxBytes)+2<<10, "MaxBytes plus the Tracker itself")
				require.InDelta(t, float64(s.Bytes), float64(peak), float64(s.Bytes)/50)
				runtime.KeepAlive(tr)
			})
		}
	}
}

// TestBeginAllocs: a retry, the path a retry storm takes, does not
// allocate; nor does End, nor a new logical request once the index is
// at its size.
func TestBeginAllocs(t *testing.T) {
	tr, _ := newTest(t, Config{MaxBytes: 1 << 20})
	r := req(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 1)
	tr.Begin(r)
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		res := tr.Begin(r)
		tr.End(&res, status(429))
	}))
	body := make([]byte, 64)
	i := uint64(0)
	fresh := func() {
		i++
		binary.LittleEndian.PutUint64(body, i)
		r.Body = body
		res := tr.Begin(r)
		tr.End(&res, status(200))
	}
	for range 100_000 {
		fresh()
	}
	require.Zero(t, testing.AllocsPerRun(1000, fresh))
	require.Zero(t, testing.AllocsPerRun(1000, func() { ParseRetryCount([]byte("12")) }))
}
