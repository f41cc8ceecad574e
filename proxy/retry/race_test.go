package retry

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestConcurrent runs Begin and End from several goroutines, with Stats
// and TopClients alongside, against a small index so that eviction and
// expiry run too; run it with -race.
func TestConcurrent(t *testing.T) {
	tr, clk := newTest(t, Config{Window: time.Second, MaxBytes: 64 << 10})
	const workers, per = 4, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := req("", w%3-1)
			r.UserAgent = fmt.Appendf(nil, "agent-%d", w%2)
			for i := range per {
				r.Body = fmt.Appendf(r.Body[:0], "body-%d", i%50)
				res := tr.Begin(r)
				clk.advance(time.Millisecond)
				tr.End(&res, Outcome{Status: []int{200, 429, 503}[i%3], FirstTokenSeen: true, PromptTokens: 3, CompletionTokens: 1})
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			tr.Stats()
			tr.TopClients(3)
		}
	})
	wg.Wait()
	s := tr.Stats()
	require.EqualValues(t, workers*per, s.Attempts)
	require.EqualValues(t, s.Attempts, s.Logical+s.Retries-s.RetriesBy[EndingUnknown])
	var byPrev int64
	for _, n := range s.RetriesBy {
		byPrev += n
	}
	require.Equal(t, s.Retries, byPrev)
	require.LessOrEqual(t, s.Bytes, int64(64<<10))
}
