package proxy

import (
	"time"

	"github.com/anvilproxy/anvilproxy/proxy/prefix"
	"github.com/anvilproxy/anvilproxy/proxy/retry"
)

// Side says which end of the proxy an error came from.
type Side uint8

// Sides of an error.
const (
	SideNone     Side = iota
	SideClient        // the agent: it went away, sent a bad request, or read too slowly
	SideUpstream      // the inference server: unreachable, timed out, or broke the stream
	SideProxy         // the proxy's own limits (body size, concurrency limiter)
)

func (s Side) String() string {
	switch s {
	case SideClient:
		return "client"
	case SideUpstream:
		return "upstream"
	case SideProxy:
		return "proxy"
	}
	return "none"
}

// ErrKind classifies how a request ended when it did not end well.
type ErrKind uint8

// Error kinds, bounded so that they can be metric labels.
const (
	ErrNone            ErrKind = iota
	ErrConnect                 // dialing the upstream failed
	ErrUpstreamTimeout         // the upstream was idle longer than the read timeout
	ErrUpstreamBroken          // the upstream closed or reset mid-response, or sent a malformed response
	ErrClientGone              // the client went away or stopped reading
	ErrBodyTooLarge            // the request body exceeded the limit
	ErrBadRequest              // the request could not be read
	ErrPoolExhausted           // no free upstream connection within the wait
	ErrLimited                 // the local limiter's queue was full or the wait too long
	ErrTruncated               // the upstream stream ended (cleanly, HTTP 200) without its end marker
	ErrShutdown                // cut when the shutdown grace ran out
	ErrOverloaded              // the proxy's memory bound for request bodies was reached
	ErrInternal                // a bug: the request's handler panicked (500)
	numErrKinds
)

var errKindNames = [numErrKinds]string{"", "connect", "upstream_timeout", "upstream_broken", "client_gone", "body_too_large", "bad_request", "pool_exhausted", "limited", "truncated", "shutdown", "overloaded", "internal"}

// ErrorLabels are the (side, kind) pairs a request can end with, for
// exporting every error series at 0 before the first error. Keep in step
// with the fail calls: a pair missing here still counts, from its first
// occurrence.
var ErrorLabels = [...]struct {
	Side Side
	Kind ErrKind
}{
	{SideClient, ErrBadRequest}, {SideClient, ErrBodyTooLarge}, {SideClient, ErrClientGone},
	{SideProxy, ErrPoolExhausted}, {SideProxy, ErrLimited}, {SideProxy, ErrShutdown}, {SideProxy, ErrOverloaded}, {SideProxy, ErrInternal},
	{SideUpstream, ErrConnect}, {SideUpstream, ErrUpstreamTimeout}, {SideUpstream, ErrUpstreamBroken},
	{SideUpstream, ErrPoolExhausted}, {SideUpstream, ErrTruncated},
}

func (k ErrKind) String() string {
	if int(k) < len(errKindNames) {
		return errKindNames[k]
	}
	return "unknown"
}

// Trace is the record of one proxied request: the stamps of docs/design.md "Stamps and phases", counts
// and token usage. It holds only values, so copying it is always safe. A zero
// time.Time stamp means the moment never came (for example no first output
// for a request that failed).
type Trace struct {
	ID        uint64
	Route     Route
	Method    string // from a fixed set ("GET", "POST", …, "OTHER"); never a client string
	Path      string // the request path without its query string, bounded and escaped (path.go)
	Model     string // bounded label: an allowed or learned model name, "other" or ""
	Stream    bool   // the response was a stream parsed event by event: text/event-stream, or ollama's NDJSON
	Status    int    // status sent to the client; 0 if none was sent
	ErrSide   Side
	ErrKind   ErrKind
	ReqBytes  int64 // request body bytes from the client
	RespBytes int64 // response body bytes the client was sent (an event hidden by --inject-usage is not counted)

	// Stamps, all from the proxy's monotonic clock.
	Recv         time.Time // request headers read from the client
	Admit        time.Time // past the local concurrency limiter (= Recv without one)
	Sent         time.Time // request fully written to the upstream
	Headers      time.Time // upstream response headers received
	FirstEvent   time.Time // first SSE event from the upstream
	FirstOutput  time.Time // first event with a non-empty reasoning, content or tool-call delta
	FirstContent time.Time // first event with a non-empty content or tool-call delta
	LastToken    time.Time // last event with any output delta
	End          time.Time // upstream body finished ([DONE], message_stop, or EOF)
	ClientDone   time.Time // last byte written and flushed to the client

	Connect     time.Duration // acquiring the upstream connection (the dial, when Cold)
	Cold        bool          // a new upstream connection was dialled for this request
	UsageInject bool          // include_usage was added upstream by --inject-usage
	// Redialed is set when the request failed on a reused upstream
	// connection before any response byte and was sent once more on a new
	// one (RedialReusedFailed). It is one client attempt all the same.
	Redialed bool

	// Upgraded is set for a request whose connection switched protocols
	// (a WebSocket): the proxy tunnelled TunnelUp bytes from the client and
	// TunnelDown bytes to it, and End is when the tunnel closed.
	Upgraded   bool
	TunnelUp   int64
	TunnelDown int64

	// Limited is set when the request passed the proxy's own concurrency
	// limiter: Admit − Recv is then the exact queue wait (possibly 0), and
	// the engine's own queue is ~0 when the limit is at most its slot
	// count (queue_source "limiter"). InflightAtAdmit is the
	// number of other requests the proxy had in flight upstream when this
	// one was admitted: the engine's load as the proxy sees it.
	Limited         bool
	InflightAtAdmit int
	// AdmitSeq and ReleaseSeq number this request's admission upstream
	// and its release among all the proxy's (0: none): another request
	// was among the InflightAtAdmit exactly when its AdmitSeq < this
	// AdmitSeq < its ReleaseSeq.
	AdmitSeq, ReleaseSeq uint64

	// Events seen on the stream, by kind. An event may count in several kinds.
	Events          int
	ReasoningEvents int
	ContentEvents   int
	ToolEvents      int
	EmptyEvents     int  // role-only, empty-delta and other events without output
	ParseErrors     int  // malformed SSE (oversized events) or unparsable event data
	Truncated       bool // the upstream stream ended without its end marker (ErrKind is then ErrTruncated unless it failed otherwise first)

	// Token usage as reported by the engine; -1 when unknown.
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64
	ReasoningTokens  int64
	UsageSeen        bool // usage came from the engine (else token counts are estimates or unknown)

	// What the engine reported about this request itself, never the
	// proxy's own stamps; negative when absent. Which engine reports
	// which is in docs/engines.md.
	ServerQueue        time.Duration // waiting before it was scheduled (vLLM metrics.queue_time_ms, TGI x-queue-time)
	ServerPrefill      time.Duration // on the prompt (llama.cpp timings.prompt_ms; vLLM time_to_first_token_ms − queue_time_ms; ollama prompt_eval_duration)
	ServerDecode       time.Duration // generating after the prompt (llama.cpp timings.predicted_ms; ollama eval_duration)
	ServerInference    time.Duration // from scheduling to the end, prompt and generation (TGI x-inference-time)
	ServerTotal        time.Duration // the engine's whole handling, from its handler's start to the end (ollama total_duration)
	ServerLoad         time.Duration // getting a loaded model, within ServerTotal (ollama load_duration)
	ServerPromptEval   int64         // prompt tokens evaluated, cache hits excluded (llama.cpp timings.prompt_n)
	ServerCachedTokens int64         // prompt tokens served from the slot's cache (llama.cpp timings.cache_n)

	// Prefix is how much of the prompt an earlier request had sent, and
	// where it drifted (docs/design.md "Prefix drift"); zero for routes that are not
	// inference. It holds hashes, lengths and offsets, never text.
	Prefix prefix.Result

	// Retry links this attempt to the client's earlier attempts at the
	// same request (docs/design.md "Retries"); zero for routes that are not inference.
	Retry retry.Result
}
