package histo

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// Span is a measured duration that may be unknown (noSpan). It marshals to
// JSON as milliseconds, the v1 schema's unit, or null: a phase that did not
// happen is reported as null, never as 0.
type Span time.Duration

// noSpan is the unknown Span.
const noSpan = Span(math.MinInt64)

func spanOf(d time.Duration, ok bool) Span {
	if !ok {
		return noSpan
	}
	return Span(d)
}

// Known reports whether s was measured.
func (s Span) Known() bool { return s != noSpan }

// Millis returns s in milliseconds; NaN when unknown.
func (s Span) Millis() float64 {
	if !s.Known() {
		return math.NaN()
	}
	return float64(s) / float64(time.Millisecond)
}

// MarshalJSON writes milliseconds or null.
func (s Span) MarshalJSON() ([]byte, error) { return Float(s.Millis()).MarshalJSON() }

// UnmarshalJSON reads milliseconds or null.
func (s *Span) UnmarshalJSON(b []byte) error {
	var f Float
	if err := f.UnmarshalJSON(b); err != nil {
		return err
	}
	*s = noSpan
	if !math.IsNaN(float64(f)) {
		*s = Span(math.Round(float64(f) * float64(time.Millisecond)))
	}
	return nil
}

// Float is a float64 that may be unknown (NaN); it marshals to JSON as a
// number or null (histo/dist).
type Float = dist.Float

// Count is a token count that may be unknown (negative, as in proxy.Trace);
// it marshals to JSON as a number or null.
type Count int64

// MarshalJSON writes the count or null.
func (c Count) MarshalJSON() ([]byte, error) {
	if c < 0 {
		return []byte("null"), nil
	}
	return strconv.AppendInt(nil, int64(c), 10), nil
}

// UnmarshalJSON reads a count or null (-1).
func (c *Count) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*c = -1
		return nil
	}
	v, err := strconv.ParseInt(string(b), 10, 64)
	*c = Count(v)
	return err
}

// Stamps are a request's proxy.Trace stamps as offsets from t_recv.
type Stamps struct {
	Admit        Span `json:"admit"`
	Sent         Span `json:"sent"`
	Headers      Span `json:"headers"`
	FirstEvent   Span `json:"first_event"`
	FirstOutput  Span `json:"first_output"`
	FirstContent Span `json:"first_content"`
	LastToken    Span `json:"last_token"`
	End          Span `json:"end"`
	ClientDone   Span `json:"client_done"`
}

// Request is the record of one finished request (of any route: see
// requests_other.go for those that are not inference): the per-request
// fields of the v1 schema's request_timings plus the proxy's own. It holds
// values only and never any prompt or completion content. JSON names follow
// the v1 schema where it has the field.
type Request struct {
	Index           int       `json:"request_index"` // position in its window, from 0
	ID              uint64    `json:"id"`            // proxy.Trace.ID
	Start           time.Time `json:"start"`         // t_recv, wall clock, UTC
	Route           string    `json:"route"`
	Model           string    `json:"model"`
	Method          string    `json:"method"`
	Path            string    `json:"path"`   // without the query string, bounded (proxy.Trace.Path)
	Status          int       `json:"status"` // 0: no status was sent
	Stream          bool      `json:"stream"`
	Failed          bool      `json:"failed"`
	Good            bool      `json:"good"` // not failed and within every SLO
	ErrSide         string    `json:"error_side,omitempty"`
	ErrKind         string    `json:"error_kind,omitempty"`
	Truncated       bool      `json:"truncated"`
	Cold            bool      `json:"cold"`
	InflightAtAdmit int       `json:"inflight_at_admit"`

	Stamps Stamps `json:"stamps_ms"`

	ProxyQueue  Span        `json:"proxy_queue_ms"`
	Connect     Span        `json:"connect_ms"`
	Queue       Span        `json:"queue_ms"` // Split.Queue: includes ProxyQueue
	Prefill     Span        `json:"prefill_ms"`
	QueueSource QueueSource `json:"queue_source"`
	TTFO        Span        `json:"time_to_first_output_ms"`
	TTFT        Span        `json:"ttft_ms"`
	Reasoning   Span        `json:"reasoning_ms"`
	Generation  Span        `json:"generation_ms"`
	TPOT        Span        `json:"tpot_ms"`
	E2E         Span        `json:"e2e_ms"`
	Tail        Span        `json:"tail_ms"`
	DecodeRate  Float       `json:"decode_tok_s"`
	PrefillRate Float       `json:"effective_prefill_tok_s"`

	PromptTokens Count `json:"prompt_tokens"`
	CachedTokens Count `json:"cached_tokens"` // as the engine reported them; null when it did not
	// CacheInferredTokens is the prompt tokens inferred as served from the
	// engine's prefix cache, from the request's prefill time against the
	// learned cold rate; null when that cannot be estimated. It is never
	// mixed with CachedTokens.
	CacheInferredTokens Count  `json:"cache_inferred_tokens"`
	ReasoningTokens     Count  `json:"reasoning_tokens"`
	OutputTokens        Count  `json:"output_tokens"`
	OutputTokenSource   string `json:"output_token_source"` // "usage", "chunks" or "" (unknown)
	UsageSeen           bool   `json:"usage_seen"`

	Events          int   `json:"events"`
	ReasoningChunks int   `json:"reasoning_chunks"`
	ContentChunks   int   `json:"content_chunks"`
	ToolChunks      int   `json:"tool_chunks"`
	ReqBytes        int64 `json:"request_bytes"`
	RespBytes       int64 `json:"response_bytes"`

	// PrefixReuse (reusable prompt-prefix bytes / prompt bytes, docs/design.md
	// "Prefix drift") and RetryAttempt (0 for a first attempt, docs/design.md "Retries") are null
	// until prefix and retry tracking fill them; v1 snapshots carry them
	// per request.
	PrefixReuse  Float `json:"prefix_reuse"`
	RetryAttempt Count `json:"retry_attempt"`

	// Conversation and Turn place the request in its conversation
	// (requests_other.go); null when it was not tracked.
	Conversation ConvID `json:"conversation"`
	Turn         Count  `json:"turn"`

	// Engine is what the engine itself said about the request, beside the
	// proxy's own figures and never mixed into them (engine.go).
	Engine EngineFigures `json:"engine"`
}

// newRequest fills rq from tr, its split and its evaluated phases. Index
// and Good are set under Recorder.mu when the request is added to a window.
func newRequest(rq *Request, tr *proxy.Trace, sp split, v *phaseValues) {
	*rq = Request{
		ID:                  tr.ID,
		Start:               tr.Recv.Round(0).UTC(), // UTC: no *Location to keep per record
		Route:               tr.Route.String(),
		Model:               tr.Model,
		Method:              tr.Method,
		Path:                tr.Path,
		Status:              tr.Status,
		Stream:              tr.Stream,
		Failed:              tr.Failed(),
		Truncated:           tr.Truncated,
		Cold:                tr.Cold,
		InflightAtAdmit:     tr.InflightAtAdmit,
		Stamps:              stampsOf(tr),
		QueueSource:         sp.Source,
		CachedTokens:        Count(tr.CachedTokens),
		CacheInferredTokens: -1, // Record infers it
		ReasoningTokens:     Count(tr.ReasoningTokens),
		UsageSeen:           tr.UsageSeen,
		Events:              tr.Events,
		ReasoningChunks:     tr.ReasoningEvents,
		ContentChunks:       tr.ContentEvents,
		ToolChunks:          tr.ToolEvents,
		ReqBytes:            tr.ReqBytes,
		RespBytes:           tr.RespBytes,
		PrefixReuse:         prefixReuse(&tr.Prefix),
		RetryAttempt:        Count(tr.Retry.Attempt), // Record takes inference routes only: always known
	}
	rq.setPhases(v)
	rq.Conversation, rq.Turn = conversationOf(&tr.Prefix)
	rq.Engine = engineFiguresOf(tr)
	if tr.ErrKind != proxy.ErrNone {
		rq.ErrSide, rq.ErrKind = tr.ErrSide.String(), tr.ErrKind.String()
	}
	rq.ProxyQueue = spanOf(tr.ProxyQueue())
	rq.Tail = spanOf(tr.Tail())
	_, rq.OutputTokenSource = tr.OutputTokens()
}

// setPhases puts a request's evaluated phases into its fields. Written
// out, not a loop over Request.slot: on Record's path the loop cost 13
// calls and 60-130 ns a request (BENCHMARKS.md "Phase table");
// TestPhaseSlots holds the two to the same fields.
func (rq *Request) setPhases(v *phaseValues) {
	rq.TTFO = spanRaw(v[MetricTTFO])
	rq.TTFT = spanRaw(v[MetricTTFT])
	rq.Queue = spanRaw(v[MetricQueue])
	rq.Prefill = spanRaw(v[MetricPrefill])
	rq.Reasoning = spanRaw(v[MetricReasoning])
	rq.Generation = spanRaw(v[MetricGeneration])
	rq.TPOT = spanRaw(v[MetricTPOT])
	rq.E2E = spanRaw(v[MetricE2E])
	rq.Connect = spanRaw(v[MetricConnect])
	rq.DecodeRate = Float(v[MetricDecodeRate])
	rq.PrefillRate = Float(v[MetricPrefillRate])
	rq.PromptTokens = countRaw(v[MetricPromptTokens])
	rq.OutputTokens = countRaw(v[MetricCompletionTokens])
}

func spanRaw(raw float64) Span {
	if raw != raw {
		return noSpan
	}
	return Span(raw)
}

func countRaw(raw float64) Count {
	if raw != raw {
		return -1
	}
	return Count(raw)
}

// phase returns rq's raw value of the per-request metric m (phaseRow.of),
// NaN when unknown.
func (rq *Request) phase(m Metric) float64 {
	span, rate, count := rq.slot(m)
	switch {
	case span != nil && span.Known():
		return float64(*span)
	case rate != nil:
		return float64(*rate)
	case count != nil && *count >= 0:
		return float64(*count)
	}
	return math.NaN()
}

// slot is the field of rq that holds the per-request metric m, as exactly
// one non-nil pointer of the field's type (TestPhaseSlots checks each
// against the row's Key, and setPhases against it). A switch, not a
// func-valued column of the table: the compiler sees through it, so the
// caller's Request stays on the stack.
func (rq *Request) slot(m Metric) (*Span, *Float, *Count) {
	switch m {
	case MetricTTFO:
		return &rq.TTFO, nil, nil
	case MetricTTFT:
		return &rq.TTFT, nil, nil
	case MetricQueue:
		return &rq.Queue, nil, nil
	case MetricPrefill:
		return &rq.Prefill, nil, nil
	case MetricReasoning:
		return &rq.Reasoning, nil, nil
	case MetricGeneration:
		return &rq.Generation, nil, nil
	case MetricTPOT:
		return &rq.TPOT, nil, nil
	case MetricE2E:
		return &rq.E2E, nil, nil
	case MetricConnect:
		return &rq.Connect, nil, nil
	case MetricDecodeRate:
		return nil, &rq.DecodeRate, nil
	case MetricPrefillRate:
		return nil, &rq.PrefillRate, nil
	case MetricPromptTokens:
		return nil, nil, &rq.PromptTokens
	case MetricCompletionTokens:
		return nil, nil, &rq.OutputTokens
	}
	return nil, nil, nil
}

func stampsOf(tr *proxy.Trace) Stamps {
	at := func(t time.Time) Span {
		if t.IsZero() || tr.Recv.IsZero() {
			return noSpan
		}
		return Span(t.Sub(tr.Recv))
	}
	return Stamps{
		Admit: at(tr.Admit), Sent: at(tr.Sent), Headers: at(tr.Headers),
		FirstEvent: at(tr.FirstEvent), FirstOutput: at(tr.FirstOutput), FirstContent: at(tr.FirstContent),
		LastToken: at(tr.LastToken), End: at(tr.End), ClientDone: at(tr.ClientDone),
	}
}

// recent is a ring of the last requests, for /requests. It is guarded by
// Recorder.mu.
type recent struct {
	buf  []Request
	next int
	n    int
}

func (r *recent) put(rq *Request) {
	r.buf[r.next] = *rq
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// newest copies out up to limit requests, newest first.
func (r *recent) newest(limit int) []Request {
	n := min(r.n, limit)
	out := make([]Request, n)
	for i := range out {
		out[i] = r.buf[(r.next-1-i+len(r.buf))%len(r.buf)]
	}
	return out
}

// Recent returns up to limit of the most recent requests, newest first.
// Safe for concurrent use; the slice is the caller's.
func (r *Recorder) Recent(limit int) []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recent.newest(limit)
}

// requestsHandler serves the most recent requests as JSON,
// {"requests": [...]}, newest first; ?limit=N returns at most N. It never
// serves content: a Request holds none.
func (r *Recorder) requestsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		limit := r.cfg.RecentRequests
		if s := req.URL.Query().Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				http.Error(w, "limit must be a non-negative integer", http.StatusBadRequest)
				return
			}
			limit = min(limit, n)
		}
		ServeJSON(w, struct {
			Requests []Request `json:"requests"`
		}{r.Recent(limit)}, false)
	})
}

// ServeJSON answers an admin request with v as JSON, indented when indent
// is set, and marked no-store: every admin answer is a live reading. A
// value that cannot be encoded is a 500. It serves /requests, /snapshot
// and /status.
func ServeJSON(w http.ResponseWriter, v any, indent bool) {
	var body []byte
	var err error
	if indent {
		body, err = json.MarshalIndent(v, "", "  ")
	} else {
		body, err = json.Marshal(v)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(append(body, '\n'))
}

// prefixReuse is the request's prefix reuse, or null when untracked.
func prefixReuse(res *prefix.Result) Float {
	if !res.Tracked || res.Reuse < 0 {
		return Float(math.NaN())
	}
	return Float(res.Reuse)
}
