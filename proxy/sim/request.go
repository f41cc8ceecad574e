package sim

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// knobs are the X-Sim-* request headers documented in the package comment.
type knobs struct {
	status       int           // 0: off
	failAttempts int           // 0: off
	failAfter    int           // -1: off
	eventGap     time.Duration // -1: off
	prefill      time.Duration // -1: off
	length       int           // -1: off
	truncAfter   int           // -1: off
	hideCached   bool          // X-Sim-Report-Cached: false
}

func parseKnobs(h http.Header) (knobs, error) {
	k := knobs{failAfter: -1, eventGap: -1, prefill: -1, length: -1, truncAfter: -1}
	reportCached := true
	// Every knob is parsed; the first malformed one, in this order, is the
	// error.
	err := cmp.Or(
		intKnob(h, "X-Sim-Status", &k.status, 400, 599, "400..599"),
		intKnob(h, "X-Sim-Fail-Attempts", &k.failAttempts, 0, math.MaxInt, "a count"),
		intKnob(h, "X-Sim-Fail-After-Events", &k.failAfter, 0, math.MaxInt, "a count"),
		durationKnob(h, "X-Sim-Event-Gap", &k.eventGap, "50ms"),
		durationKnob(h, "X-Sim-Prefill", &k.prefill, "2s"),
		boolKnob(h, "X-Sim-Report-Cached", &reportCached),
		intKnob(h, "X-Sim-Truncate-After-Events", &k.truncAfter, 0, math.MaxInt, "a count"),
		intKnob(h, "X-Sim-Completion-Tokens", &k.length, 1, math.MaxInt, "a count >= 1"),
	)
	k.hideCached = !reportCached
	return k, err
}

// intKnob sets *dst to header name, an integer in [lo, hi], when it is
// present; want says what a malformed value should have been.
func intKnob(h http.Header, name string, dst *int, lo, hi int, want string) error {
	v := h.Get(name)
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return badKnob(name, v, want)
	}
	*dst = n
	return nil
}

// durationKnob sets *dst to header name, a non-negative duration, when it
// is present; example is one in the error.
func durationKnob(h http.Header, name string, dst *time.Duration, example string) error {
	v := h.Get(name)
	if v == "" {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return badKnob(name, v, "a duration such as "+example)
	}
	*dst = d
	return nil
}

// boolKnob sets *dst to header name when it is present.
func boolKnob(h http.Header, name string, dst *bool) error {
	v := h.Get(name)
	if v == "" {
		return nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return badKnob(name, v, "true or false")
	}
	*dst = b
	return nil
}

func badKnob(name, value, want string) error {
	return fmt.Errorf("sim: bad %s %q: want %s", name, value, want)
}

// newJob parses a generation request with p and its knobs.
func (s *Server) newJob(r *http.Request, body []byte, p protocol, arrived time.Time) (*job, error) {
	j := &job{arrived: arrived, created: arrived.Unix(), bodyHash: hashBody(body)}
	var err error
	if j.knobs, err = parseKnobs(r.Header); err != nil {
		return nil, err
	}
	if err := p.parse(body, j); err != nil {
		return nil, err
	}
	if j.limited && j.maxTokens < 1 {
		return nil, fmt.Errorf("max tokens must be at least 1, got %d", j.maxTokens)
	}
	s.length(j)
	s.drawTruncation(j)
	j.hideCached = s.cfg.UnreportedCache || j.knobs.hideCached
	j.base = r.Header.Get("X-Request-Id")
	if j.base == "" {
		// Each id takes two steps of one SplitMix64 sequence, so ids are
		// unique (its output function is a bijection) and reproducible.
		x := uint64(s.cfg.Seed) + 2*s.seq.Add(1)*0x9e3779b97f4a7c15
		j.base = fmt.Sprintf("%016x%016x", splitmix(&x), splitmix(&x))
	}
	j.id = p.prefix() + j.base
	return j, nil
}

// length decides how many tokens j generates and whether its limit cut it
// (finish "length"): the natural length drawn for its prompt, or set by
// X-Sim-Completion-Tokens, unless the request's limit is smaller. On entry
// j.maxTokens and j.limited are the request's limit and whether it set one.
func (s *Server) length(j *job) {
	if s.cfg.ExactLength && j.knobs.length < 0 {
		if !j.limited {
			j.maxTokens = s.cfg.DefaultMaxTokens
		}
		return
	}
	natural := j.knobs.length
	if natural < 0 {
		// Seeded by the prompt, as the text is: the same conversation gets
		// the same answer length from a seeded engine.
		rng := hashBody([]byte(j.prompt)) ^ uint64(s.cfg.Seed) ^ 0x1e46
		natural = drawLength(s.cfg.NaturalLengths, &rng)
	}
	if j.limited && j.maxTokens < natural {
		return // the limit cuts the answer: finish "length"
	}
	j.maxTokens, j.limited = natural, false
}

// drawTruncation decides, with probability Config.TruncateRate, that j's
// stream ends early, after a uniformly drawn number of its tokens (at least
// one, never all). The draw comes from a sequence seeded by Config.Seed, in
// request order.
func (s *Server) drawTruncation(j *job) {
	if s.cfg.TruncateRate == 0 || !j.stream || j.maxTokens < 2 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.trunc.Float64() < s.cfg.TruncateRate {
		j.truncTokens = 1 + s.trunc.IntN(j.maxTokens-1)
	}
}

// tokenLimit returns the first limit the request set, in order of
// precedence (vLLM prefers max_completion_tokens over max_tokens).
func tokenLimit(limits ...*int) (n int, set bool) {
	for _, l := range limits {
		if l != nil {
			return *l, true
		}
	}
	return 0, false
}

// fault returns the status an injected fault answers j with, or 0.
func (s *Server) fault(j *job) (int, string) {
	if j.knobs.status != 0 {
		return j.knobs.status, "sim: status requested by X-Sim-Status"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := j.knobs.failAttempts; n > 0 {
		if len(s.attempts) >= maxAttemptKeys {
			clear(s.attempts)
		}
		s.attempts[j.bodyHash]++
		if s.attempts[j.bodyHash] <= n {
			return http.StatusTooManyRequests, "sim: attempt refused by X-Sim-Fail-Attempts"
		}
	}
	if s.cfg.FailRate > 0 && s.fail.Float64() < s.cfg.FailRate {
		return http.StatusInternalServerError, "sim: failure drawn by Config.FailRate"
	}
	return 0, ""
}

// maxAttemptKeys bounds the X-Sim-Fail-Attempts memory; tests send far fewer
// distinct bodies than this.
const maxAttemptKeys = 1 << 16

func hashBody(body []byte) uint64 {
	h := fnv.New64a()
	h.Write(body)
	return h.Sum64()
}

// promptBuilder builds the prompt text that stands for the tokens the
// engine would see after applying the chat template.
type promptBuilder struct{ strings.Builder }

// raw appends JSON as sent, unless it is absent or null.
func (b *promptBuilder) raw(v json.RawMessage) {
	if len(v) == 0 || bytes.Equal(v, []byte("null")) {
		return
	}
	b.Write(v)
	b.WriteByte('\n')
}

// message appends "role\ncontent\n". content is a JSON string, an array of
// parts (a part's "text" counts; other parts count as their JSON), or null.
func (b *promptBuilder) message(role string, content json.RawMessage) error {
	b.WriteString(role)
	b.WriteByte('\n')
	if err := b.content(content); err != nil {
		return err
	}
	b.WriteByte('\n')
	return nil
}

func (b *promptBuilder) content(content json.RawMessage) error {
	content = bytes.TrimSpace(content)
	switch {
	case len(content) == 0 || bytes.Equal(content, []byte("null")):
		return nil
	case content[0] == '"':
		var s string
		if err := json.Unmarshal(content, &s); err != nil {
			return err
		}
		b.WriteString(s)
		return nil
	case content[0] == '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(content, &parts); err != nil {
			return err
		}
		for _, part := range parts {
			var p struct {
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(part, &p); err != nil || p.Text == nil {
				b.Write(part)
				continue
			}
			b.WriteString(*p.Text)
		}
		return nil
	}
	return errors.New("content must be a string or an array of parts")
}
