package snapshot

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
)

// Source is what the snapshot loop and the /snapshot handler read:
// *histo.Recorder.
type Source interface {
	Rotate() *histo.Window
	Current() *histo.Window
	PrefillRate() (rate float64, samples int, ok bool)
}

// Build returns the v1 document of one measurement window. pm is the
// prefill-rate model's state when the window ended. Build only reads w.
func Build(w *histo.Window, pm PrefillModel) (*Document, error) {
	return assemble([]*part{windowPart(w, pm)})
}

// BuildFrom builds the document of src's current window without ending
// it, for /snapshot.
func BuildFrom(src Source) (*Document, error) {
	return Build(src.Current(), prefillModel(src))
}

// prefillModel is the state of src's prefill-rate model.
func prefillModel(src Source) PrefillModel {
	rate, n, ok := src.PrefillRate()
	pm := PrefillModel{Ready: ok, Samples: n, TokensPerS: Num(rate)}
	if !ok {
		pm.TokensPerS = nan
	}
	return pm
}

// Handler serves the current window of src as a v1 document, for the admin
// listener's /snapshot.
func Handler(src Source) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		doc, err := BuildFrom(src)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		histo.ServeJSON(w, doc, true)
	})
}

// windowPart is w as one input of assemble.
func windowPart(w *histo.Window, pm PrefillModel) *part {
	p := &part{
		start: w.Start.UnixNano(), end: w.End.UnixNano(),
		wallMs:        float64(w.End.Sub(w.Start)) / float64(time.Millisecond),
		runID:         runID(w.Start),
		protocol:      Protocol,
		methodology:   methodologyJSON,
		doc:           &Document{},
		requests:      w.Goodput.Requests,
		failed:        w.Goodput.Failed,
		hist:          w.Hist,
		complete:      w.Dropped == 0,
		goodput:       &w.Goodput,
		retry:         w.Retry,
		prefix:        w.Prefix,
		conversations: w.Conversations,
		ledger:        w.Ledger,
		concurrency:   w.Concurrency,
		quality:       w.Quality,
		cache:         w.Cache,
		slots:         w.Slots,
		engine:        w.Engine,
		queueSources:  make(map[string]int64, len(w.QueueSources)),
		clamped:       make(map[string]int64, histo.NumMetrics),
		dropped:       w.Dropped,
		models:        make(map[string]int64),
		prefill:       &pm,
		maxInflight:   -1,
		windows:       1,
	}
	for s, n := range w.QueueSources {
		p.queueSources[string(s)] = n
	}
	for m, n := range w.Clamped {
		p.clamped[histo.Metric(m).String()] = n
	}
	for rq := range w.Requests.All() {
		if rq.Model != "" {
			p.models[rq.Model]++
		}
		if rq.Stamps.Headers.Known() {
			p.responses++
		}
		p.maxInflight = max(p.maxInflight, histo.Count(rq.InflightAtAdmit+1))
		if rq.Failed {
			b, err := json.Marshal(failureOf(rq))
			if err != nil {
				panic("BUG: a Failure does not marshal: " + err.Error())
			}
			p.failures = append(p.failures, b)
			continue
		}
		p.timings = append(p.timings, timingOf(rq))
	}
	p.countTimings()
	p.hitExact = true
	return p
}

// runID names a window by its start, as its file does.
func runID(start time.Time) string {
	return "anvilproxy-" + start.UTC().Format("20060102T150405.000Z")
}

func ms(s histo.Span) Num { return Num(s.Millis()) }

func timingOf(rq *histo.Request) Timing {
	t := unknownTiming()
	putPhases(&t, rq) // the phase table's fields
	t.CacheInferredTokens = rq.CacheInferredTokens
	t.CachedTokens = rq.CachedTokens
	t.ContentChunks = histo.Count(rq.ContentChunks)
	t.EngineCachedTokens = rq.Engine.CachedTokens
	t.EngineDecodeMs = ms(rq.Engine.Decode)
	t.EngineInferenceMs = ms(rq.Engine.Inference)
	t.EnginePromptEvalTokens = rq.Engine.PromptEval
	t.EngineRunningAtAdmit = rq.Engine.RunningAtAdmit
	t.EngineLoadMs = ms(rq.Engine.Load)
	t.EnginePrefillMs = ms(rq.Engine.Prefill)
	t.EngineQueueMs = ms(rq.Engine.Queue)
	t.EngineTotalMs = ms(rq.Engine.Total)
	t.EngineWaitingAtAdmit = rq.Engine.WaitingAtAdmit
	t.Model = str(rq.Model)
	t.OutputTokenSource = str(rq.OutputTokenSource)
	t.PrefixReuse = Num(rq.PrefixReuse)
	t.ProxyQueueMs = ms(rq.ProxyQueue)
	t.QueueSource = str(string(rq.QueueSource))
	t.ReasoningChunks = histo.Count(rq.ReasoningChunks)
	t.ReasoningTokens = rq.ReasoningTokens
	t.RequestIndex = int64(rq.Index)
	t.RetryAttempt = rq.RetryAttempt
	t.Route = str(rq.Route)
	t.StartedAtUnixNs = histo.Count(rq.Start.UnixNano())
	t.Status = histo.Count(rq.Status)
	if rq.E2E.Known() && rq.TTFT.Known() {
		t.VisibleGenerationMs = ms(rq.E2E - rq.TTFT)
	}
	return t
}

func failureOf(rq *histo.Request) Failure {
	f := Failure{
		CacheInferredTokens: rq.CacheInferredTokens,
		CachedTokens:        rq.CachedTokens,
		E2EMs:               ms(rq.E2E),
		ErrorKind:           str(rq.ErrKind),
		ErrorSide:           str(rq.ErrSide),
		Model:               str(rq.Model),
		OutputTokens:        rq.OutputTokens,
		PrefillMs:           ms(rq.Prefill),
		PromptTokens:        rq.PromptTokens,
		QueueMs:             ms(rq.Queue),
		QueueSource:         str(string(rq.QueueSource)),
		RequestIndex:        int64(rq.Index),
		RetryAttempt:        rq.RetryAttempt,
		Route:               str(rq.Route),
		StartedAtUnixNs:     histo.Count(rq.Start.UnixNano()),
		Status:              histo.Count(rq.Status),
		TimeToFirstOutputMs: ms(rq.TTFO),
		Truncated:           rq.Truncated,
		TtftMs:              ms(rq.TTFT),
	}
	if rq.Status == 0 {
		f.Status = -1
	}
	return f
}

var _ Source = (*histo.Recorder)(nil)
