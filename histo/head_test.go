package histo

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// headBurst records bursts of three requests on a one-slot engine, each
// burst 10 s after the last, the response head of each sent as mode says:
// at the request's arrival, at its slot start, or with its first output.
// Every request has 100 ms of prefill; the second and third of a burst
// wait 299 and 598 ms. It returns the records, newest first.
func headBurst(t *testing.T, r *Recorder, bursts int, mode string) []Request {
	t.Helper()
	for b := range bursts {
		o := float64(b) * 10000
		trs := []proxy.Trace{served(o, o+100, o+300, 0), served(o+1, o+400, o+600, 1), served(o+2, o+700, o+900, 2)}
		for i := range trs {
			tr := &trs[i]
			slot := tr.FirstOutput.Add(-100 * time.Millisecond)
			switch mode {
			case HeadAdmission:
				tr.Headers = tr.Admit.Add(500 * time.Microsecond)
			case HeadSlotStart:
				tr.Headers = slot.Add(500 * time.Microsecond)
			}
			r.Record(tr)
		}
	}
	return r.Recent(3 * bursts)
}

// TestHeadModeLearned: the proxy learns from the traffic when the engine
// sends its response head. A head at slot start (llama.cpp) is used as
// evidence once learned; a head at admission (vLLM) or with the first
// output (ollama) never is.
func TestHeadModeLearned(t *testing.T) {
	for _, mode := range []string{HeadAdmission, HeadSlotStart, HeadFirstOutput} {
		r, _, _ := newTest(t, Config{})
		got := headBurst(t, r, 4, mode)
		require.Equal(t, mode, r.Slots().ResponseHead, mode)
		for _, rq := range got[:3] { // the last burst
			want := SourceOccupancy
			if mode == HeadSlotStart {
				want = SourceHeaders
			}
			require.Equal(t, want, rq.QueueSource, mode)
		}
		require.InDelta(t, 598, got[0].Queue.Millis(), 1, mode)
		require.InDelta(t, 299, got[1].Queue.Millis(), 1, mode)
	}
}

// TestHeadSlotStartSeesHiddenQueue: once the head is known to leave at
// slot start, it holds where the timeline cannot: a request queued behind
// traffic that reached the engine by another way (another replica of the
// proxy) is split by its head, not read as a 400 ms prefill.
func TestHeadSlotStartSeesHiddenQueue(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	headBurst(t, r, 3, HeadSlotStart)
	hidden := served(50000, 50400, 50600, 0) // nothing the proxy saw was ahead
	hidden.Headers = at(50300)
	r.Record(&hidden)
	rq := r.Recent(1)[0]
	require.Equal(t, SourceHeaders, rq.QueueSource)
	require.InDelta(t, 300, rq.Queue.Millis(), 1e-6)
	require.InDelta(t, 100, rq.Prefill.Millis(), 1e-6)
}

// TestHeadDelayWithoutQueueIsNotSlotStart: an engine whose head always
// comes some milliseconds after arrival, before the prefill, whatever the
// queue (the fixture's 48 ms), is not taken for a slot-start head: the
// delay comes on requests with nothing ahead too.
func TestHeadDelayWithoutQueueIsNotSlotStart(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	for i := range 20 {
		c := chat() // head at 50 ms, first output at 300, nothing ahead
		tr := shifted(&c, time.Duration(i)*10*time.Second)
		r.Record(&tr)
	}
	require.NotEqual(t, HeadSlotStart, r.Slots().ResponseHead)
	require.Equal(t, Span(0), r.Recent(1)[0].Queue)
}
