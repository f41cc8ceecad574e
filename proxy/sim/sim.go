// Package sim is a simulated LLM inference server: the embedded default
// upstream of anvilproxy and the fixture of its tests.
//
// It speaks the OpenAI chat completions and legacy completions APIs as vLLM
// emits them, the OpenAI Responses API and the Anthropic Messages API, and it
// is calibrated to the seed run, histo/snapshot/testdata/reference.json (model
// qwen38-swift15-ninfer-dflash2-c4-262k on an RTX 5090): 4 slots with a FIFO
// queue, prefill at ~7,700 uncached tokens/s, a block prefix cache, decode at
// ~235 tokens/s per stream with ~5 tokens per SSE event (speculative decoding
// emits several tokens per event), reasoning before content.
//
// The engine (admission, slots, prefix cache, prefill and decode timing) is
// protocol-blind; a protocol value per request renders the engine's events as
// one API's JSON and SSE (handler.go: the interface and a request's life,
// written once; chat.go, completions.go, messages.go, responses.go: one API
// each; openai.go: the envelope and stream end the two OpenAI endpoints
// share). No text is ever generated from the prompt: output is
// deterministic filler words, one word per token.
//
// Engine personas (Config.Engine; persona.go): the zero value behaves as
// vLLM; EngineLlamaCpp and EngineOllama behave as llama.cpp's llama-server
// and ollama where their scheduling and reporting differ (measured against
// both and read in their sources; docs/engines.md has the table per engine).
// Each difference is a knob of its own, which the persona only defaults.
//
// Timing model, per request:
//
//	queue    waits FIFO until one of Config.Slots is free; with per-slot
//	         caches (Config.Cache, llama.cpp and ollama) it takes the free
//	         slot whose last prompt shares the longest prefix with its own;
//	         with Config.KVCacheTokens (continuous batching, as vLLM's KV
//	         budget beside max_num_seqs) the head also waits until its prompt
//	         and completion fit in the KV cache, and everyone behind it waits
//	switch   with llama.cpp's RAM prompt cache (Config.SwitchCost), a slot
//	         about to overwrite the prompt it holds saves it first, and a
//	         longer prefix held in the RAM cache is restored: work before
//	         the prefill that is neither queue nor this prompt's prefill
//	prefill  (prompt_tokens − cached_tokens) / PrefillTokensPerSec + 1 ms;
//	         with Config.ContextSlowdown (llama.cpp, ollama) each new token
//	         costs more the more context it attends to
//	decode   the first token comes out at the end of prefill; after it, the
//	         event that ends at completion token i is due i−1 tokens later at
//	         DecodeTokensPerSec, scheduled from the decode start so that timing
//	         never drifts; so (completion_tokens−1)/generation time is the rate
//	release  vLLM frees the slot with the last token, which carries the
//	         finish reason; llama.cpp and ollama (Config.Release) at the
//	         stream's end: an answer that stops by itself takes one more
//	         decode step (the end-of-sequence token, never sent), then a
//	         chunk of its own carries the finish reason and the slot is let go
//
// A stream's response head leaves (Config.Head) as soon as the request is
// enqueued (vLLM), when a slot starts its prompt (llama.cpp: head − sent is
// the queue) or with the first output (ollama); its first event (role
// chunk, message_start, response.created) comes at the end of prefill, just
// before the first output event, which carries tokens. A whole response's
// head leaves with its body; with Config.TGIHeaders it carries TGI's
// x-queue-time, x-inference-time … headers.
//
// Per-request timing (Config.Timings): vLLM's "metrics" object, or
// llama.cpp's "timings" (prompt_n, prompt_ms, predicted_n, predicted_ms,
// predicted_per_token_ms, cache_n) on the final chunk — the usage chunk
// when one is asked for — and the whole body; usage's
// prompt_tokens_details.cached_tokens is then cache_n.
//
// A client that goes away is noticed through the request context, which
// net/http cancels when the connection closes even while the handler sleeps
// (as vLLM notices a disconnect during prefill): the request leaves the queue
// or stops decode at once, and the abort is counted in Stats and sent on
// Aborts at once. A prefill runs on as Config.Abandon says: vLLM stops at
// once, llama.cpp finishes the 2,048-token batch it is on, ollama the whole
// prompt; the slot stays busy for nobody meanwhile, and what was prefilled
// stays in the slot's cache.
//
// Prompt tokens are len(prompt text)/BytesPerToken (at least 1). The prompt
// text is: the tools JSON as sent, then "role\ncontent\n" per message in order
// (content parts contribute their "text", other parts their JSON); for
// completions it is the prompt; for Responses, instructions then input items;
// for Messages, tools, system, then messages.
//
// Answers end by themselves, as a model's do: each request has a natural
// length drawn from Config.NaturalLengths (by default the reference run's
// 274–519 tokens), deterministically from its prompt and Config.Seed, and
// ends there with finish reason "stop" ("end_turn" for Messages, status
// "completed" for Responses). Only when the request's token limit
// (max_completion_tokens, max_tokens, max_output_tokens) is smaller does the
// limit cut it: that many tokens, finish "length" ("max_tokens"). With
// Config.ExactLength the completion is exactly the limit (or
// Config.DefaultMaxTokens when none is set), as before natural stops.
//
// Connections: the server HTTPServer returns closes a keep-alive connection
// idle for Config.KeepAliveTimeout, 5 s by default, as uvicorn does in front
// of vLLM and SGLang; a client that pools connections meets a closed one
// after a pause between turns.
//
// Usage reports the cached prompt tokens, as vLLM does
// (prompt_tokens_details.cached_tokens; Messages: cache_read_input_tokens,
// input_tokens excluding them), unless Config.UnreportedCache: then no cached
// count is reported, as from ollama (Responses say cached_tokens 0, as
// ollama's do), while the cache still cuts prefill.
//
// A share of streams (Config.TruncateRate, or X-Sim-Truncate-After-Events)
// ends unfinished but cleanly, as ollama ends a generation it stopped for
// repetition: HTTP 200 and a terminated chunked body, but no finish reason,
// no usage, no [DONE], no closing events. X-Sim-Fail-After-Events instead
// drops the connection mid-body.
//
// The engine records the truth of every request it admitted — its true
// queue wait, the slot it held, the work before its prefill, prefill
// time, the cached tokens it used, when its head left, its last token, the
// instant its slot was let go and how long an abandoned prefill ran on —
// for in-process tests to compare with what a proxy inferred
// (Server.Truth); none of it is sent to the client.
//
// llama.cpp's native POST /completion (alias /completions) takes "prompt",
// "n_predict" and "stream" and answers as llama-server does: a stream of
// "data: {"content": …, "stop": false}" objects, then one final object with
// "stop": true, stop_type ("eos", "limit"), tokens_predicted,
// tokens_evaluated, tokens_cached and timings — no choices, no usage, no
// [DONE]; a whole answer is that final object with the whole content.
// Served whatever Config.Engine, with llama.cpp's timings always.
//
// ollama's native POST /api/generate ("prompt", "system") and /api/chat
// ("messages", "tools") take "stream" (true unless false), "think" and
// "options":{"num_predict"} and answer as ollama v0.17.4 does (ollama.go):
// NDJSON (application/x-ndjson), one object per line with the new text
// ("response", or "message":{"role","content"}; reasoning in "thinking")
// and "done": false, then the done line with done_reason and the Metrics
// computed from the sim's truth as ollama measures them (total_duration,
// load_duration, prompt_eval_count, prompt_eval_duration from slot start to
// the first token, eval_count with the end-of-sequence step, eval_duration);
// "stream": false answers the done object with the whole text. Served
// whatever Config.Engine.
//
// GET /metrics (Config.Metrics) serves the engine's own metrics under its
// real names, beside the sim's sim_* counters: vLLM's (running, waiting, KV
// usage, prefix-cache queries and hits, token counters, per-request queue,
// prefill, decode, inference, e2e and TTFT histograms) or llama-server's
// (requests processing and deferred, prompt tokens excluding cached, cached
// prompt tokens, prompt seconds, tokens predicted), or 404 as from ollama.
//
// Reasoning is on for chat completions and Responses unless the request sends
// "reasoning_effort":"none" (Responses: "reasoning":{"effort":"none"}) or
// "chat_template_kwargs":{"enable_thinking":false}; on for Messages only when
// "thinking":{"type":"enabled"} or "adaptive" (as Anthropic does); never for completions.
//
// Request headers steer single requests (the proxy forwards them unchanged):
//
//	X-Sim-Status: 503           answer this status (400-599) at once with a JSON error
//	X-Sim-Fail-Attempts: 2      answer 429 to the first 2 attempts of each distinct
//	                            body (keyed by a hash of the body), then serve normally
//	X-Sim-Fail-After-Events: 3  after 3 output events drop the connection without the
//	                            final chunk or [DONE] (0: right after the opening events;
//	                            beyond the last event: before the closing events), so
//	                            the client sees an unexpected EOF; a non-stream request
//	                            drops before any response byte
//	X-Sim-Truncate-After-Events: 3
//	                            after 3 output events end the stream cleanly, as
//	                            ollama does (HTTP 200, chunked end, but no finish
//	                            reason, usage, [DONE] or closing events); before
//	                            the final output event if the answer has fewer;
//	                            non-stream requests are answered in full
//	X-Sim-Event-Gap: 50ms       decode events exactly this far apart (tokens per event
//	                            unchanged); a time.ParseDuration string
//	X-Sim-Prefill: 2s           prefill takes exactly this long
//	X-Sim-Report-Cached: false  report no cached tokens for this request, as
//	                            Config.UnreportedCache does for all
//	X-Sim-Completion-Tokens: 40 this request's natural length is 40 tokens (a
//	                            smaller limit still cuts it); also with ExactLength
//	X-Request-Id: abc           the response id becomes "chatcmpl-abc" (per protocol
//	                            prefix) and the header is echoed, as vLLM does
//
// A knob with a malformed value is answered with 400.
package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultModel is the model name the simulator serves when Config.Model is
// empty: the model of the seed run it is calibrated to.
const DefaultModel = "qwen38-swift15-ninfer-dflash2-c4-262k"

// maxBodyBytes bounds a request body: a 262k-token context is about 1 MiB of
// text, so 32 MiB leaves room for tools, images as data URLs and JSON escapes.
const maxBodyBytes = 32 << 20

// Config configures a Server. The zero value is the calibrated default.
type Config struct {
	// Model is the served model name, reported in every response whatever
	// the request asked for. "" means DefaultModel.
	Model string
	// Engine is the real engine the simulator behaves like; it sets the
	// defaults of Cache, Release and UnreportedCache (persona.go). The zero
	// value is EngineVLLM, the calibrated default.
	Engine Engine
	// Cache is where reusable prompt prefixes live and so how a slot is
	// chosen: shared blocks (vLLM) or each slot's own prompt, with the free
	// slot of the longest prefix match chosen (llama.cpp, ollama). The
	// zero value is the Engine's.
	Cache CacheMode
	// Release is when a finished request lets its slot go: with its last
	// token (vLLM) or at the stream's end, one decode step later for an
	// answer that stopped by itself (llama.cpp, ollama). The zero value is
	// the Engine's.
	Release ReleaseMode
	// Abandon is what a prefill whose client left does: stop at once
	// (vLLM), finish its BatchTokens batch (llama.cpp) or the whole prompt
	// (ollama) before the slot is free. The zero value is the Engine's.
	Abandon AbandonMode
	// BatchLock is whether a slot can start while another request's
	// prefill computes: LockNone (vLLM, llama.cpp), or LockPrefill
	// (ollama's llamarunner holds its mutex for a prefill batch, and a
	// request needs it to take its free slot). The zero value is the
	// Engine's.
	BatchLock LockMode
	// ArrivalJitter makes requests that arrive within it of each other
	// reach the FIFO queue in random order, as ollama's server handlers
	// reach its semaphore (7 requests sent within 1 ms queued in an order
	// unrelated to their sending): each request waits a random time below
	// it (from Seed) before it is enqueued, counted as queue in its Truth.
	// 0 means none.
	ArrivalJitter time.Duration
	// SharedPrefill makes the prefills that start together under
	// LockPrefill share the engine's compute, as ollama's llamarunner
	// decodes every slot's prompt chunk in one batch on the same threads
	// (P=4, three requests sharing: 320 ms each where one alone took
	// 121 ms): each of a group granted together takes Σ min(w, its w)
	// over the group's solo prefill times w (processor sharing) instead of
	// its own. Without the lock (BatchLock LockNone) the prefills in
	// progress compute one after another in the order they began: a
	// request has its slot at once (no queue) and its prefill computes, at
	// its own speed, once those begun before it have. That approximates
	// llama.cpp and vLLM, which also give the tokens a batch has left
	// after the earlier prompt (llama.cpp's n_batch, vLLM's chunked-prefill
	// budget) to the next ones, so a short prompt behind another's last
	// batch starts, and may end, in it; the sim is exact when the earlier
	// prompt's remainder fills the batch. A prefill whose client left
	// keeps only the work it did under AbandonStop and AbandonBatch (none
	// while it waited its turn) and the later ones move up. Off, each runs
	// at its own speed.
	SharedPrefill bool
	// BatchTokens is the prefill batch of AbandonBatch, llama.cpp's
	// n_batch. 0 means 2048.
	BatchTokens int
	// SwitchCost is the cost of saving a slot's prompt to llama.cpp's RAM
	// prompt cache (--cache-ram) before another prompt overwrites it, and
	// of restoring a longer prefix from it; work before the prefill that is
	// neither queue nor prefill (12–58 ms measured per switch). Only with
	// per-slot caches. 0 means the Engine's: 15 ms for llama.cpp (so a save
	// and a restore take 30 ms), no RAM cache for the others; negative
	// means no RAM cache.
	SwitchCost time.Duration
	// ContextSlowdown makes prefill cost per new token grow with the
	// context it attends to: each new token costs 1/PrefillTokensPerSec ×
	// (1 + ContextSlowdown × context/1000), context being the cached prefix
	// plus the new tokens before it, so a cold rate under-estimates the
	// cached tokens of a long history. 0 means the Engine's: 0.1 for
	// llama.cpp and ollama (CPU attention), none for vLLM; negative means
	// none.
	ContextSlowdown float64
	// Metrics is the form of GET /metrics: vLLM's names (vllm:…),
	// llama-server's (llamacpp:…), both beside the sim's own sim_…, or none
	// (404, as ollama). The zero value is the Engine's.
	Metrics MetricsForm
	// KVCacheTokens bounds admission by KV-cache tokens, as vLLM's
	// continuous batching admits a waiting request only while its blocks
	// fit: a request reserves its prompt plus its planned completion while
	// it holds a slot, and the head of the queue waits (with everyone behind
	// it, first come first served) until its reservation fits, however many
	// of the Slots (max_num_seqs) are free. A request that could never fit is
	// answered 400. Reserving the whole completion up front stands for
	// vLLM's growing allocation without its preemption. 0 means no bound
	// beyond the Slots; with many slots and a bound this is the
	// continuous-batching mode.
	KVCacheTokens int
	// Slots is the number of sequences generated concurrently. 0 means 4.
	Slots int
	// MaxQueue is the number of requests that may wait for a slot, in FIFO
	// order; one more is answered 429. 0 means 64.
	MaxQueue int
	// PrefillTokensPerSec is the prefill rate for uncached prompt tokens.
	// 0 means 7700.
	PrefillTokensPerSec float64
	// DecodeTokensPerSec is the decode rate of one stream. 0 means 235.
	DecodeTokensPerSec float64
	// TokensPerEvent is the mean number of tokens per output event; event
	// sizes vary deterministically between 1 and 2*TokensPerEvent-1.
	// 0 means 5.
	TokensPerEvent int
	// BytesPerToken is the prompt token estimate. 0 means 4.
	BytesPerToken int
	// DefaultMaxTokens is the completion length when the request sets no
	// limit, with ExactLength. 0 means 256.
	DefaultMaxTokens int
	// NaturalLengths is a sample of natural completion lengths: each
	// request's answer ends by itself ("stop") after a length drawn between
	// them (their quantiles, interpolated), deterministically from the
	// prompt and Seed, unless the request's limit is smaller. nil means
	// ReferenceLengths (274–519 tokens). It is sorted on New.
	NaturalLengths []int
	// ExactLength makes every completion exactly the request's limit, or
	// DefaultMaxTokens when it sets none, with finish "length" when it set
	// one: the simulator's behaviour before natural stops, for tests that
	// need a known length. X-Sim-Completion-Tokens sets one request's
	// natural length instead.
	ExactLength bool
	// ReasoningShare is the share of completion tokens that are reasoning
	// when reasoning is on (rounded down). 0 means 0.5.
	ReasoningShare float64
	// Timings selects the per-request timing report. The zero value is the
	// Engine's: none for vLLM and ollama, llama.cpp's timings object for
	// EngineLlamaCpp.
	Timings TimingMode
	// Head is when a stream's response head leaves: on admission (vLLM),
	// when the slot starts the prompt (llama.cpp) or with the first output
	// (ollama). The zero value is the Engine's.
	Head HeadMode
	// TGIHeaders adds text-generation-inference's timing headers to every
	// non-stream response: x-total-time, x-validation-time, x-queue-time,
	// x-inference-time (slot start to the end), x-time-per-token, in whole
	// milliseconds, and x-prompt-tokens, x-generated-tokens
	// (huggingface/text-generation-inference router/src/server.rs).
	TGIHeaders bool
	// CacheBlockTokens is the prefix cache granularity. 0 means 16.
	CacheBlockTokens int
	// CacheBlocks is the prefix cache capacity in blocks, evicted least
	// recently used first. 0 means 1<<16.
	CacheBlocks int
	// FailRate is the share of requests answered with 500, drawn from a
	// sequence seeded by Seed. 0 means none.
	FailRate float64
	// TruncateRate is the share of streamed answers that end early but
	// cleanly, as ollama ends a generation it stopped for repetition: HTTP
	// 200, the chunked body terminated, but no finish reason, no usage, no
	// [DONE] (Messages: no message_delta or message_stop; Responses: no
	// response.completed), after a uniformly drawn part of the answer. Drawn
	// from a sequence seeded by Seed. 0 means none. Non-stream answers are
	// never truncated.
	TruncateRate float64
	// Seed makes event sizes, filler text, ids, FailRate and TruncateRate
	// reproducible.
	Seed int64
	// UnreportedCache makes the engine report no cached prompt tokens while
	// its prefix cache still cuts prefill, as ollama and many llama.cpp
	// based servers do: chat and legacy completions usage has no
	// prompt_tokens_details, Messages usage no cache_read_input_tokens
	// (input_tokens is the whole prompt), and Responses usage says
	// cached_tokens 0 (as ollama's /v1/responses does). Cache hits are then
	// visible only in timing. Timings (llama.cpp's cache_n) are unaffected:
	// they are a separate, explicit choice. The zero value reports them, as
	// vLLM does.
	UnreportedCache bool
	// KeepAliveTimeout is how long an idle keep-alive connection stays
	// open, applied by the server HTTPServer returns. 0 means
	// DefaultKeepAliveTimeout (5 s, uvicorn's); negative means never, as
	// Go net/http engines such as ollama.
	KeepAliveTimeout time.Duration
}

// TimingMode selects how a response reports the engine's own timing, which
// lets the proxy split queue from prefill (docs/design.md "Queue vs prefill").
type TimingMode int

const (
	// TimingAuto is the Engine's choice: llamacpp for EngineLlamaCpp, none
	// for the others.
	TimingAuto TimingMode = iota
	// TimingNone reports no timing.
	TimingNone
	// TimingVLLM adds vLLM's per-request "metrics" object
	// (--enable-per-request-metrics) to the usage chunk, the non-stream
	// body and the completed Responses object.
	TimingVLLM
	// TimingLlamaCpp adds llama.cpp's "timings" object to the last JSON chunk
	// and the non-stream body of the OpenAI endpoints.
	TimingLlamaCpp
)

var timingNames = enumText[TimingMode]{"auto", "none", "vllm", "llamacpp"}

// String returns "auto", "none", "vllm" or "llamacpp".
func (m TimingMode) String() string { return timingNames.text(m) }

// MarshalText implements encoding.TextMarshaler.
func (m TimingMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler, so a TimingMode can be
// a flag.TextVar.
func (m *TimingMode) UnmarshalText(b []byte) error { return timingNames.parse("timing mode", b, m) }

// Server is a simulated inference server. It is an http.Handler, safe for
// concurrent use; it starts no goroutines of its own, so every request is
// served by its handler goroutine and nothing outlives it.
type Server struct {
	cfg    Config
	mux    *http.ServeMux
	seq    atomic.Uint64
	aborts chan AbortEvent

	mu       sync.Mutex // guards the fields below
	active   int        // busy slots
	slots    []slot     // Config.Slots of them
	grants   uint64     // slots granted so far, for LRU order
	queue    []*ticket  // FIFO, head first
	cache    *prefixCache
	attempts map[uint64]int
	fail     *rand.Rand
	trunc    *rand.Rand
	jitter   *rand.Rand // ArrivalJitter's draws
	// prefilling counts the prefills holding the engine's lock
	// (LockPrefill).
	prefilling int
	// computing is the compute turns of the prefills in progress, in the
	// order they began (SharedPrefill without the lock): a new one
	// computes after the last.
	computing []*reservation
	stats     Stats
	truths    *truths
	counters  engineCounters
	kvUsed    int // KV tokens reserved by the requests holding slots

	metrics http.Handler    // GET /metrics in Config.Metrics form
	hists   *vllmHistograms // nil unless MetricsVLLM; safe for concurrent use
}

// New returns a Server for cfg with defaults filled in, or an error naming
// the first invalid field.
func New(cfg Config) (*Server, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		aborts:   make(chan AbortEvent, abortBuffer),
		cache:    newPrefixCache(cfg.CacheBlockTokens, cfg.BytesPerToken, cfg.CacheBlocks),
		attempts: make(map[uint64]int),
		fail:     rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5eed)),
		trunc:    rand.New(rand.NewPCG(uint64(cfg.Seed), 0x7256)),
		jitter:   rand.New(rand.NewPCG(uint64(cfg.Seed), 0x717e)),
		truths:   newTruths(),
		slots:    make([]slot, cfg.Slots),
	}
	s.metrics = s.newMetricsHandler()
	s.mux = s.routes()
	return s, nil
}

// Config returns the configuration in effect, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

func withDefaults(c Config) (Config, error) {
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"Slots", &c.Slots, 4},
		{"MaxQueue", &c.MaxQueue, 64},
		{"TokensPerEvent", &c.TokensPerEvent, 5},
		{"BytesPerToken", &c.BytesPerToken, 4},
		{"DefaultMaxTokens", &c.DefaultMaxTokens, 256},
		{"CacheBlockTokens", &c.CacheBlockTokens, 16},
		{"CacheBlocks", &c.CacheBlocks, 1 << 16},
		{"BatchTokens", &c.BatchTokens, 2048},
		{"KVCacheTokens", &c.KVCacheTokens, 0},
	}
	for _, f := range ints {
		if *f.v < 0 {
			return c, fmt.Errorf("sim: %s is %d, want >= 0", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	floats := []struct {
		name     string
		v        *float64
		def, max float64
	}{
		{"PrefillTokensPerSec", &c.PrefillTokensPerSec, 7700, math.MaxFloat64},
		{"DecodeTokensPerSec", &c.DecodeTokensPerSec, 235, math.MaxFloat64},
		{"ReasoningShare", &c.ReasoningShare, 0.5, 1},
		{"FailRate", &c.FailRate, 0, 1},
		{"TruncateRate", &c.TruncateRate, 0, 1},
	}
	if math.IsNaN(c.ContextSlowdown) || math.IsInf(c.ContextSlowdown, 0) {
		return c, fmt.Errorf("sim: ContextSlowdown is %v", c.ContextSlowdown)
	}
	for _, f := range floats {
		if !(*f.v >= 0 && *f.v <= f.max) { // also rejects NaN
			return c, fmt.Errorf("sim: %s is %v, want 0..%v", f.name, *f.v, f.max)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if err := applyPersona(&c); err != nil {
		return c, err
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.NaturalLengths == nil {
		c.NaturalLengths = ReferenceLengths
	}
	c.NaturalLengths = slices.Sorted(slices.Values(c.NaturalLengths)) // a copy: the caller's slice stays theirs
	if len(c.NaturalLengths) == 0 || c.NaturalLengths[0] < 1 {
		return c, fmt.Errorf("sim: NaturalLengths %v, want at least one length >= 1", c.NaturalLengths)
	}
	if c.KeepAliveTimeout == 0 {
		c.KeepAliveTimeout = DefaultKeepAliveTimeout
	}
	return c, nil
}

// ServeHTTP serves the inference API:
//
//	POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages,
//	     /completion and /completions (llama.cpp's native protocol)
//	GET  /v1/models, /health, /metrics (in Config.Metrics form)
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for _, r := range []struct {
		method, path string
		h            http.HandlerFunc
	}{
		{"POST", "/v1/chat/completions", s.generation(newChat)},
		{"POST", "/v1/completions", s.generation(newCompletion)},
		{"POST", "/v1/responses", s.generation(newResponses)},
		{"POST", "/v1/messages", s.generation(newMessages)},
		{"POST", "/completion", s.generation(newNative)},
		{"POST", "/completions", s.generation(newNative)},
		{"POST", "/api/generate", s.generation(newOllamaGenerate)},
		{"POST", "/api/chat", s.generation(newOllamaChat)},
		{"GET", "/v1/models", s.serveModels},
		{"GET", "/health", serveHealth},
		{"GET", "/metrics", s.metrics.ServeHTTP},
	} {
		mux.HandleFunc(r.method+" "+r.path, r.h)
		mux.HandleFunc(r.path, serveMethodNotAllowed)
	}
	mux.HandleFunc("/", serveNotFound)
	return mux
}

// Stats is a snapshot of a Server's counters. Token totals include the
// work done for requests that were later aborted.
type Stats struct {
	Requests    int64 // generation requests received
	Completed   int64 // answered in full
	Aborted     int64 // the client went away first
	Rejected429 int64 // answered 429: queue full or X-Sim-Fail-Attempts
	Failed      int64 // answered another error status, or cut by X-Sim-Fail-After-Events
	Truncated   int64 // streams ended cleanly without their final events

	Active   int // holding a slot now
	Queued   int // waiting for a slot now
	KVTokens int // KV-cache tokens reserved by the requests holding a slot: prompt plus planned completion

	PromptTokens     int64 // prompt tokens of requests that reached prefill
	CachedTokens     int64 // the part of PromptTokens served by the prefix cache
	CompletionTokens int64 // tokens generated

	LastAbort time.Time // when the latest abort was noticed; zero if none
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Active = s.active
	st.Queued = len(s.queue)
	st.KVTokens = s.kvUsed
	return st
}

// Phase is where a request was when its client went away.
type Phase string

// The phases of a request in the engine.
const (
	PhaseQueue   Phase = "queue"
	PhasePrefill Phase = "prefill"
	PhaseDecode  Phase = "decode"
)

// AbortEvent reports that the engine stopped work for a client that went
// away.
type AbortEvent struct {
	ID     string    // the response id, such as "chatcmpl-…"
	At     time.Time // when the engine noticed
	Tokens int       // completion tokens generated before it stopped
	Phase  Phase
}

// abortBuffer is the capacity of the Aborts channel.
const abortBuffer = 1024

// Aborts returns a channel that receives one AbortEvent per abort. It is
// buffered (1024); when nobody drains it, further events are dropped rather
// than delaying a handler, and Stats still counts them.
func (s *Server) Aborts() <-chan AbortEvent { return s.aborts }
