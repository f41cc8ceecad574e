package sim

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// prefillOverhead is the fixed cost of a prefill, so that a fully cached
// prompt still takes one engine step.
const prefillOverhead = time.Millisecond

// errClientGone ends a generation whose client went away; the abort has been
// recorded by then.
var errClientGone = errors.New("sim: client went away")

// errInjected ends a generation cut short by X-Sim-Fail-After-Events.
var errInjected = errors.New("sim: injected mid-stream failure")

// errTruncated ends a stream early but cleanly, as ollama ends a generation
// it stopped for repetition: no finish, no usage, no closing events.
var errTruncated = errors.New("sim: stream truncated")

// job is what the engine needs from a request, whatever its protocol.
type job struct {
	id        string // response id with the protocol's prefix
	base      string // id without prefix, for derived item ids
	prompt    string // the text whose bytes are the prompt tokens
	maxTokens int    // completion length: the request's limit until Server.length decides
	limited   bool   // the limit cuts the answer, so the finish is "length" ("max_tokens")
	reasoning bool
	stream    bool
	created   int64 // Unix seconds, as in "created"
	arrived   time.Time
	enqueued  time.Time // it joined the engine's queue (after parsing and the arrival jitter)
	bodyHash  uint64
	hashes    []uint64 // the prompt's prefix-cache block hashes
	// promptTokens is len(prompt)/BytesPerToken, at least 1.
	promptTokens int
	knobs        knobs
	// hideCached: the usage reports no cached tokens (Config.UnreportedCache
	// or X-Sim-Report-Cached: false); the cache still cuts prefill.
	hideCached bool
	// truncTokens > 0 truncates the stream once that many tokens are out
	// (drawn by Config.TruncateRate); 0: off.
	truncTokens int
}

// truncating reports whether j's stream ends without its final event.
func (j *job) truncating() bool {
	return j.stream && (j.knobs.truncAfter >= 0 || j.truncTokens > 0)
}

// truncatesAt reports whether j's stream ends before output event k, when
// emitted tokens are out.
func (j *job) truncatesAt(k, emitted int) bool {
	if !j.stream {
		return false
	}
	return k == j.knobs.truncAfter || (j.truncTokens > 0 && emitted >= j.truncTokens)
}

// delta is one output event: a run of tokens of one kind.
type delta struct {
	reasoning bool
	text      string
	tokens    int
	last      bool // the final output event of the request
}

// result is what the engine did for one request, filled in as it runs.
// Protocols render it; it is owned by the request's handler goroutine.
type result struct {
	promptTokens     int
	cachedTokens     int
	completionTokens int // generated so far
	reasoningTokens  int

	queue   time.Duration // arrival to slot
	prefill time.Duration // prefill start to first token
	decode  time.Duration // first token to latest token

	slot     int       // the slot held; -1 until admitted
	admitted time.Time // slot acquired; zero until then
	// prefillStart is when the prefill proper starts: admitted plus the
	// work before it (prePrefill); zero until admitted.
	prefillStart time.Time
	firstToken   time.Time // end of prefill; zero until then
	lastToken    time.Time // the latest output event went out; zero until then
	head         time.Time // the response head left; zero until then
	left         time.Time // the engine noticed the client left during prefill; zero if not
	// abandoned is how long the slot stayed busy after left: the prefill
	// work the engine finished anyway (Config.Abandon).
	abandoned time.Duration
	released  time.Time // the slot was let go; zero until then
	// locked is set while its prefill holds the engine's lock
	// (LockPrefill): from its slot start to its first token, or to the end
	// of an abandoned prefill's run-on.
	locked bool
	group  *prefillGroup // the prefills it shares the engine with (SharedPrefill), nil if none

	reasoning strings.Builder
	content   strings.Builder
}

// output receives a request's events as the engine produces them. An error
// means the client is gone and ends the generation.
type output interface {
	// head sends the response head if it has not left yet, stamping
	// res.head; a non-stream response's head leaves with its body instead.
	head(res *result)
	start(res *result) error
	token(res *result, d delta) error
	// end writes what follows the last output event: a stream's closing
	// events, or the whole non-stream response.
	end(res *result) error
}

// unaryOutput is the output of a non-stream request: the text is collected
// in the result and the whole body written at the end.
type unaryOutput struct {
	w   http.ResponseWriter
	p   protocol
	j   *job
	tgi bool // Config.TGIHeaders
}

func (unaryOutput) head(*result)               {}
func (unaryOutput) start(*result) error        { return nil }
func (unaryOutput) token(*result, delta) error { return nil }
func (o unaryOutput) end(res *result) error {
	res.head = time.Now()
	if o.tgi {
		setTGIHeaders(o.w.Header(), o.j, res, res.head)
	}
	return writeJSON(o.w, http.StatusOK, o.p.body(res))
}

// setTGIHeaders sets text-generation-inference's timing headers on a
// response written at now, as its router does for /generate (whole
// milliseconds; router/src/server.rs): validation is arrival to enqueue,
// queue enqueue to slot start, inference slot start to now.
func setTGIHeaders(h http.Header, j *job, res *result, now time.Time) {
	total, inference := now.Sub(j.arrived), now.Sub(res.admitted)
	validation := max(0, total-res.queue-inference)
	perToken := time.Duration(0)
	if res.completionTokens > 0 {
		perToken = inference / time.Duration(res.completionTokens)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"x-total-time", total.Milliseconds()},
		{"x-validation-time", validation.Milliseconds()},
		{"x-queue-time", res.queue.Milliseconds()},
		{"x-inference-time", inference.Milliseconds()},
		{"x-time-per-token", perToken.Milliseconds()},
		{"x-prompt-tokens", int64(res.promptTokens)},
		{"x-generated-tokens", int64(res.completionTokens)},
	} {
		h.Set(f.name, strconv.FormatInt(f.v, 10))
	}
}

// run takes an enqueued request through queue, prefill, decode and its
// end, sending its events to out. It returns errClientGone after recording
// an abort, errInjected when X-Sim-Fail-After-Events cut it short, or
// errTruncated when the stream is to end cleanly without its final events.
func (s *Server) run(ctx context.Context, t *ticket, j *job, out output) (*result, error) {
	res := &result{slot: -1}
	defer s.account(res)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	if s.cfg.Head == HeadAdmission {
		out.head(res)
	}
	if err := s.wait(ctx, t); err != nil {
		return res, s.abort(j, res, PhaseQueue)
	}
	held := true
	letGo := func() {
		if held {
			held = false
			// Stamped before the slot is let go, so a successor is never
			// admitted before its predecessor finished.
			res.released = time.Now()
			s.release(t.slot)
		}
	}
	defer letGo()
	res.admitted, res.slot = time.Now(), t.slot
	s.mu.Lock()
	res.locked, t.locked = t.locked, false // the lock passes to its prefill
	res.group = t.group
	s.mu.Unlock()
	defer s.unlockPrefill(res) // a request that fails before its prefill gives it back
	res.queue = res.admitted.Sub(j.arrived)
	if s.cfg.Head == HeadSlotStart {
		out.head(res)
	}

	if err := s.startPrompt(ctx, timer, j, res, t.slot); err != nil {
		return res, err
	}
	if err := out.start(res); err != nil {
		return res, s.abort(j, res, PhaseDecode)
	}
	if err := s.decode(ctx, timer, j, res, out, res.firstToken); err != nil {
		return res, err
	}
	return res, s.end(ctx, timer, j, res, out, letGo)
}

// startPrompt takes res from slot start to its first token on slot k: the
// cache lookup and any work before the prefill, then the prefill.
func (s *Server) startPrompt(ctx context.Context, timer *time.Timer, j *job, res *result, k int) error {
	res.promptTokens = j.promptTokens
	s.mu.Lock()
	work := s.prePrefill(k, j.hashes, res)
	s.stats.PromptTokens += int64(res.promptTokens)
	s.stats.CachedTokens += int64(res.cachedTokens)
	s.mu.Unlock()

	res.prefillStart = res.admitted.Add(work)
	if err := s.prefill(ctx, timer, j, res, k, res.prefillStart); err != nil {
		return err
	}
	res.firstToken = time.Now()
	res.prefill = res.firstToken.Sub(res.prefillStart)
	s.mu.Lock()
	s.keep(k, j.hashes)
	s.counters.countPrefill(res)
	s.mu.Unlock()
	return nil
}

// end writes what follows the last output event and lets the slot go
// (letGo), in Config.Release's order: vLLM frees the slot first; llama.cpp
// and ollama write the final chunk first, after the end-of-sequence
// token's own decode step when the answer stopped by itself.
func (s *Server) end(ctx context.Context, timer *time.Timer, j *job, res *result, out output, letGo func()) error {
	if s.cfg.Release == ReleaseLastToken {
		letGo()
	} else if !j.limited {
		if err := sleepUntil(ctx, timer, res.lastToken.Add(s.step(j))); err != nil {
			return s.abort(j, res, PhaseDecode)
		}
	}
	err := out.end(res)
	letGo()
	if err != nil {
		return s.abort(j, res, PhaseDecode)
	}
	return nil
}

// step is the time of one decode step of j: one token at the decode rate,
// or X-Sim-Event-Gap.
func (s *Server) step(j *job) time.Duration {
	if j.knobs.eventGap >= 0 {
		return j.knobs.eventGap
	}
	return perRate(1, s.cfg.DecodeTokensPerSec)
}

// decode emits the completion as planned events, each due at a time
// computed from start so that timer lateness never accumulates.
func (s *Server) decode(ctx context.Context, timer *time.Timer, j *job, res *result, out output, start time.Time) error {
	p := newPlan(j, s.cfg)
	for k := 0; !p.done(); k++ {
		if k == j.knobs.failAfter {
			return errInjected
		}
		if j.truncatesAt(k, p.emitted) {
			return errTruncated
		}
		n, reasoning := p.next()
		if p.done() && j.truncating() {
			return errTruncated // a truncated stream never carries its final event
		}
		due := start.Add(perRate(p.emitted-1, s.cfg.DecodeTokensPerSec))
		if j.knobs.eventGap >= 0 {
			due = start.Add(time.Duration(k) * j.knobs.eventGap)
		}
		if err := sleepUntil(ctx, timer, due); err != nil {
			return s.abort(j, res, PhaseDecode)
		}
		d := delta{reasoning: reasoning, text: p.text(n), tokens: n, last: p.done()}
		res.add(d)
		res.lastToken = time.Now()
		res.decode = res.lastToken.Sub(start)
		if err := out.token(res, d); err != nil {
			return s.abort(j, res, PhaseDecode)
		}
	}
	if j.knobs.failAfter >= 0 {
		return errInjected
	}
	return nil
}

func (res *result) add(d delta) {
	res.completionTokens += d.tokens
	if d.reasoning {
		res.reasoningTokens += d.tokens
		res.reasoning.WriteString(d.text)
	} else {
		res.content.WriteString(d.text)
	}
}

// sleepUntil waits for due on t, or returns ctx's error as soon as ctx
// ends. A due time in the past still checks ctx, so a client that left
// while the engine ran late is noticed before the next event.
func sleepUntil(ctx context.Context, t *time.Timer, due time.Time) error {
	d := time.Until(due)
	if d <= 0 {
		return ctx.Err()
	}
	t.Reset(d)
	select {
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func perRate(tokens int, perSec float64) time.Duration {
	return time.Duration(float64(tokens) / perSec * float64(time.Second))
}

// abort records that the engine stopped work for j in phase and returns
// errClientGone.
func (s *Server) abort(j *job, res *result, phase Phase) error {
	ev := AbortEvent{ID: j.id, At: time.Now(), Tokens: res.completionTokens, Phase: phase}
	s.mu.Lock()
	s.stats.Aborted++
	s.stats.LastAbort = ev.At
	s.mu.Unlock()
	select {
	case s.aborts <- ev:
	default:
	}
	return errClientGone
}

func (s *Server) account(res *result) {
	s.mu.Lock()
	s.stats.CompletionTokens += int64(res.completionTokens)
	s.mu.Unlock()
}
