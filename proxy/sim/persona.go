package sim

import (
	"fmt"
	"slices"
	"time"
)

// Engine is the real engine the simulator behaves like: it chooses the
// defaults of the scheduling, response-head, release, cache and reporting
// knobs left at their zero value (docs/engines.md: each engine's behaviour
// and its sources).
//
//	knob             vllm (zero value)  llamacpp           ollama
//	Cache            shared blocks      per slot           per slot
//	Release          last token         stream end         stream end
//	Head             admission          slot start         first output
//	Timings          none               llamacpp           none
//	Abandon          stop               batch (2,048)      whole prompt
//	BatchLock        none               none               prefill
//	SwitchCost       no RAM cache       15 ms              no RAM cache
//	ContextSlowdown  none               0.1 per 1k         0.1 per 1k
//	Metrics          vllm:…             llamacpp:…         none (404)
//	cached tokens    reported           reported           never reported
type Engine int

const (
	// EngineVLLM is vLLM: continuous batching over Slots sequences, one
	// prefix cache of blocks shared by all, the response head on admission,
	// a sequence freed in the step that generates its last token. The
	// calibrated default.
	EngineVLLM Engine = iota
	// EngineLlamaCpp is llama.cpp's llama-server with -np Slots: each slot
	// keeps the prompt it last served, a request takes the free slot with
	// the longest prefix match, the head leaves when the slot starts the
	// prompt, the final chunk (one decode step after the last token) frees
	// the slot and carries the timings object.
	EngineLlamaCpp
	// EngineOllama is ollama's runner with OLLAMA_NUM_PARALLEL=Slots: slots
	// chosen by prefix match as llama.cpp's, the head with the first output,
	// the slot freed at the stream's end, no cached count reported.
	EngineOllama
)

// enumText marshals the small enums of the configuration by name.
type enumText[T ~int] []string

func (names enumText[T]) text(v T) string {
	if v < 0 || int(v) >= len(names) {
		return fmt.Sprintf("%d", int(v))
	}
	return names[v]
}

func (names enumText[T]) parse(kind string, b []byte, v *T) error {
	i := slices.Index(names, string(b))
	if i < 0 {
		return fmt.Errorf("sim: unknown %s %q (want one of %v)", kind, b, []string(names))
	}
	*v = T(i)
	return nil
}

func (names enumText[T]) valid(v T) bool { return v >= 0 && int(v) < len(names) }

var engineNames = enumText[Engine]{"vllm", "llamacpp", "ollama"}

// String returns "vllm", "llamacpp" or "ollama".
func (e Engine) String() string { return engineNames.text(e) }

// MarshalText implements encoding.TextMarshaler.
func (e Engine) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (flag.TextVar).
func (e *Engine) UnmarshalText(b []byte) error { return engineNames.parse("engine", b, e) }

// CacheMode is where the engine keeps reusable prompt prefixes.
type CacheMode int

const (
	// CacheAuto is the Engine's choice.
	CacheAuto CacheMode = iota
	// CacheShared is vLLM's automatic prefix caching: one LRU of prompt
	// blocks shared by every sequence; any slot serves any prefix.
	CacheShared
	// CacheSlot is llama.cpp's and ollama's: each slot's KV cache holds the
	// prompt it served last, a request reuses the common prefix with the
	// slot it gets, and the scheduler gives it the free slot whose prompt
	// matches longest (the least recently used among equals).
	CacheSlot
)

var cacheNames = enumText[CacheMode]{"auto", "shared", "slot"}

// String returns "auto", "shared" or "slot".
func (m CacheMode) String() string { return cacheNames.text(m) }

// MarshalText implements encoding.TextMarshaler.
func (m CacheMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (flag.TextVar).
func (m *CacheMode) UnmarshalText(b []byte) error { return cacheNames.parse("cache mode", b, m) }

// ReleaseMode is when a finished request lets its slot go.
type ReleaseMode int

const (
	// ReleaseAuto is the Engine's choice.
	ReleaseAuto ReleaseMode = iota
	// ReleaseLastToken frees the slot in the step that generates the last
	// token, which carries the finish reason, as vLLM does; the usage chunk
	// and [DONE] follow at once.
	ReleaseLastToken
	// ReleaseStreamEnd frees the slot at the stream's end, as llama.cpp and
	// ollama do: an answer that stops by itself takes one more decode step
	// (the end-of-sequence token, never sent), then the final chunk with the
	// finish reason, usage and timings goes out and the slot is let go. An
	// answer cut by its token limit ends with its last token.
	ReleaseStreamEnd
)

var releaseNames = enumText[ReleaseMode]{"auto", "last-token", "stream-end"}

// String returns "auto", "last-token" or "stream-end".
func (m ReleaseMode) String() string { return releaseNames.text(m) }

// MarshalText implements encoding.TextMarshaler.
func (m ReleaseMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (flag.TextVar).
func (m *ReleaseMode) UnmarshalText(b []byte) error {
	return releaseNames.parse("release mode", b, m)
}

// HeadMode is when a stream's response head (status and headers) leaves.
// A non-stream response's head always leaves with its body.
type HeadMode int

const (
	// HeadAuto is the Engine's choice.
	HeadAuto HeadMode = iota
	// HeadAdmission sends the head as soon as the request is enqueued,
	// before any queueing or prefill, as vLLM's StreamingResponse does: the
	// head says nothing about the engine's queue.
	HeadAdmission
	// HeadSlotStart sends the head when a slot starts the prompt, as
	// llama.cpp does: head − sent is the queue, first output − head the
	// prefill (and any work before it).
	HeadSlotStart
	// HeadFirstOutput sends the head with the first output event, as
	// ollama does: the head carries no queue information.
	HeadFirstOutput
)

var headNames = enumText[HeadMode]{"auto", "admission", "slot-start", "first-output"}

// String returns "auto", "admission", "slot-start" or "first-output".
func (m HeadMode) String() string { return headNames.text(m) }

// MarshalText implements encoding.TextMarshaler.
func (m HeadMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (flag.TextVar).
func (m *HeadMode) UnmarshalText(b []byte) error { return headNames.parse("head mode", b, m) }

// persona is the set of defaults an Engine brings.
type persona struct {
	cache      CacheMode
	release    ReleaseMode
	head       HeadMode
	timings    TimingMode
	abandon    AbandonMode
	lock       LockMode
	switchCost time.Duration
	slowdown   float64
	metrics    MetricsForm
	hideCached bool
}

func (e Engine) persona() persona {
	switch e {
	case EngineLlamaCpp:
		return persona{cache: CacheSlot, release: ReleaseStreamEnd, head: HeadSlotStart, timings: TimingLlamaCpp,
			abandon: AbandonBatch, lock: LockNone, switchCost: 15 * time.Millisecond, slowdown: 0.1, metrics: MetricsLlamaCpp}
	case EngineOllama:
		return persona{cache: CacheSlot, release: ReleaseStreamEnd, head: HeadFirstOutput, timings: TimingNone,
			abandon: AbandonPrompt, lock: LockPrefill, switchCost: -1, slowdown: 0.1, metrics: MetricsNone, hideCached: true}
	}
	return persona{cache: CacheShared, release: ReleaseLastToken, head: HeadAdmission, timings: TimingNone,
		abandon: AbandonStop, lock: LockNone, switchCost: -1, metrics: MetricsVLLM}
}

// applyPersona fills the knobs left at their zero value from c.Engine.
func applyPersona(c *Config) error {
	if !engineNames.valid(c.Engine) {
		return fmt.Errorf("sim: unknown Engine %d", int(c.Engine))
	}
	if !cacheNames.valid(c.Cache) || !releaseNames.valid(c.Release) || !headNames.valid(c.Head) ||
		!timingNames.valid(c.Timings) || !abandonNames.valid(c.Abandon) || !metricsNames.valid(c.Metrics) ||
		!lockNames.valid(c.BatchLock) {
		return fmt.Errorf("sim: unknown Cache %d, Release %d, Head %d, Timings %d or Abandon %d",
			int(c.Cache), int(c.Release), int(c.Head), int(c.Timings), int(c.Abandon))
	}
	p := c.Engine.persona()
	if c.Cache == CacheAuto {
		c.Cache = p.cache
	}
	if c.Release == ReleaseAuto {
		c.Release = p.release
	}
	if c.Head == HeadAuto {
		c.Head = p.head
	}
	if c.Timings == TimingAuto {
		c.Timings = p.timings
	}
	if c.Abandon == AbandonAuto {
		c.Abandon = p.abandon
	}
	if c.BatchLock == LockAuto {
		c.BatchLock = p.lock
	}
	if c.SwitchCost == 0 {
		c.SwitchCost = p.switchCost
	}
	if c.ContextSlowdown == 0 {
		c.ContextSlowdown = p.slowdown
	}
	if c.Metrics == MetricsAuto {
		c.Metrics = p.metrics
	}
	c.UnreportedCache = c.UnreportedCache || p.hideCached
	return nil
}
