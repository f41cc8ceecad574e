package histo

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// atLevel is a request admitted with level others in flight that waited
// queue ms in the engine (reported by it) and was served in 1000 ms: 200
// ms of prefill and 800 of generation.
func atLevel(level int, queue float64) proxy.Trace {
	tr := chat()
	tr.InflightAtAdmit = level
	tr.Connect = 0
	tr.ServerQueue, tr.ServerPrefill = ms2d(queue), ms2d(200)
	tr.FirstEvent, tr.FirstOutput, tr.FirstContent = at(queue+200), at(queue+200), at(queue+300)
	tr.LastToken, tr.End, tr.ClientDone = at(queue+999), at(queue+1000), at(queue+1001)
	return tr
}

// slots2 is an engine with two slots: below two in flight no wait, then a
// wait for one service time per two requests ahead.
func slots2(level int) float64 { return float64(level/2) * 1000 * 0.9 }

// kneeWindow records n requests at each level and returns the section.
func kneeWindow(t *testing.T, counts map[int]int, edit func(level, i int, tr *proxy.Trace)) *ConcurrencySection {
	t.Helper()
	r, _, _ := newTest(t, Config{EngineSlots: 2})
	for level, n := range counts {
		for i := range n {
			tr := atLevel(level, slots2(level)+float64(i))
			if edit != nil {
				edit(level, i, &tr)
			}
			r.Record(&tr)
		}
	}
	return r.Rotate().Concurrency
}

func TestKnee(t *testing.T) {
	even := map[int]int{0: 10, 1: 10, 2: 10, 3: 10, 4: 10, 5: 10}
	s := kneeWindow(t, even, nil)
	require.Len(t, s.Levels, 6)
	require.Equal(t, Count(2), s.Knee, "queue p95 900 ms >= half the 1000 ms service")
	require.Equal(t, kneeRule, s.KneeRule)
	require.Equal(t, Count(2), s.Typical)
	require.Equal(t, ReadingAtKnee, s.Reading)
	l := s.Levels[2]
	require.Equal(t, ConcurrencyLevel{Level: "2", Inflight: 2, Requests: 10, Rejected: 0, QueueMs: l.QueueMs, ServiceMs: l.ServiceMs}, l)
	require.InEpsilon(t, 909, float64(l.QueueMs.P95), 0.01)
	require.InEpsilon(t, 1000, float64(l.ServiceMs.P50), 0.01)
	require.InDelta(t, 9, float64(s.Levels[1].QueueMs.Max), 0.1, "below the slots: no wait but the scripted 0-9 ms")

	for _, c := range []struct {
		name    string
		counts  map[int]int
		reading string
		typical Count
	}{
		{"most traffic below the knee", map[int]int{0: 40, 1: 30, 2: 10, 3: 5}, ReadingHeadroom, 1},
		{"most traffic above it", map[int]int{0: 2, 1: 2, 2: 5, 3: 10, 4: 20}, ReadingQueueBound, 4},
		{"the knee never reached", map[int]int{0: 20, 1: 20}, ReadingHeadroom, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := kneeWindow(t, c.counts, nil)
			require.Equal(t, c.reading, s.Reading)
			require.Equal(t, c.typical, s.Typical)
		})
	}
	require.Equal(t, Count(-1), kneeWindow(t, map[int]int{0: 20, 1: 20}, nil).Knee)
	require.Equal(t, maxLevel, kneeWindow(t, map[int]int{0: 1, 70: 1}, nil).Levels[1].Inflight, "capped: 64+")
	require.Equal(t, "64+", kneeWindow(t, map[int]int{70: 1}, nil).Levels[0].Level)
}

func TestKneeRejecting(t *testing.T) {
	counts := map[int]int{0: 30, 1: 30, 2: 20, 3: 10, 4: 10}
	// The engine answers 429 to one in ten requests at the top levels.
	s := kneeWindow(t, counts, func(level, i int, tr *proxy.Trace) {
		if level >= 3 && i%10 == 0 {
			tr.Status = 429
			tr.FirstOutput, tr.FirstContent, tr.LastToken = time.Time{}, time.Time{}, time.Time{}
		}
	})
	require.Equal(t, int64(1), s.Levels[4].Rejected)
	require.Equal(t, ReadingRejecting, s.Reading)
	require.Equal(t, Count(2), s.Knee, "the knee stands")

	// A single 503 among many requests at the top is not a pattern.
	s = kneeWindow(t, map[int]int{0: 20, 1: 20, 2: 60}, func(level, i int, tr *proxy.Trace) {
		if level == 2 && i == 0 {
			tr.Status = 503
		}
	})
	require.Equal(t, ReadingAtKnee, s.Reading)

	// The proxy's limiter refusing requests: they have no level, and count
	// at the top.
	r, _, _ := newTest(t, Config{})
	for i := range 20 {
		tr := atLevel(i%2, 0)
		r.Record(&tr)
	}
	for range 2 {
		tr := chat()
		tr.Status, tr.ErrSide, tr.ErrKind = 503, proxy.SideProxy, proxy.ErrLimited
		r.Record(&tr)
	}
	s = r.Rotate().Concurrency
	require.Equal(t, int64(2), s.LimiterRejected)
	require.Equal(t, int64(10), s.Levels[0].Requests, "refused requests are not at level 0")
	require.Equal(t, ReadingRejecting, s.Reading)
}

func TestMergeConcurrency(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	record := func(levels ...int) *ConcurrencySection {
		for i, l := range levels {
			tr := atLevel(l, slots2(l)+float64(i))
			r.Record(&tr)
		}
		return r.Rotate().Concurrency
	}
	a := record(0, 1, 2, 3, 0, 1)
	b := record(2, 3, 4, 5, 4, 4)
	whole := record(0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 4, 4)
	m := MergeConcurrency(a, b)
	for i := range whole.Levels { // the recorded values differ by i; compare counts
		require.Equal(t, whole.Levels[i].Requests, m.Levels[i].Requests)
		require.Equal(t, whole.Levels[i].QueueMs.Count, m.Levels[i].QueueMs.Count)
	}
	require.Equal(t, Count(2), m.Knee)
	require.Equal(t, whole.Typical, m.Typical)
	require.Equal(t, whole.Reading, m.Reading)
	require.Same(t, a, MergeConcurrency(nil, a))
}
