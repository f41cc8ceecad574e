package sim

import "strings"

// plan decides, deterministically from the prompt and Config.Seed, how a
// completion is cut into events and which filler words it says.
//
// The first event carries one token, the one sampled at the end of prefill;
// after it, event sizes are uniform in 1..2*mean-1, like a speculative
// decoder accepting a varying number of draft tokens per step. An event never
// mixes reasoning and content.
type plan struct {
	rng       uint64
	mean      int
	total     int
	reasoning int // the first reasoning tokens are reasoning
	emitted   int
	events    int
}

func newPlan(j *job, cfg Config) *plan {
	p := &plan{
		// Seeded by the prompt, not the body, so that options that do not
		// change the prompt (stream_options) do not change the text.
		rng:   hashBody([]byte(j.prompt)) ^ uint64(cfg.Seed),
		mean:  cfg.TokensPerEvent,
		total: j.maxTokens,
	}
	if j.reasoning {
		p.reasoning = int(float64(p.total) * cfg.ReasoningShare)
	}
	return p
}

func (p *plan) done() bool { return p.emitted >= p.total }

// next returns the size and kind of the next event.
func (p *plan) next() (tokens int, reasoning bool) {
	tokens = 1
	if p.events > 0 {
		tokens += int(splitmix(&p.rng) % uint64(2*p.mean-1))
	}
	reasoning = p.emitted < p.reasoning
	end := p.total
	if reasoning {
		end = p.reasoning
	}
	tokens = min(tokens, end-p.emitted)
	p.emitted += tokens
	p.events++
	return tokens, reasoning
}

// fillerWords are the simulator's vocabulary: one word and a space is one
// token. The words say nothing and never come from the prompt.
var fillerWords = [...]string{
	"the", "sim", "emits", "filler", "tokens", "at", "a", "steady", "rate",
	"so", "every", "phase", "can", "be", "timed", "without", "gpu", "cache",
	"block", "slot", "queue", "decode", "prefill", "stream", "event", "proxy",
	"agent", "tool", "call", "plan", "step", "done",
}

// text returns n filler tokens.
func (p *plan) text(n int) string {
	var b strings.Builder
	b.Grow(n * 8)
	for range n {
		b.WriteString(fillerWords[splitmix(&p.rng)%uint64(len(fillerWords))])
		b.WriteByte(' ')
	}
	return b.String()
}

// splitmix advances *x and returns the next SplitMix64 value: a tiny
// deterministic generator that needs no allocation or locking.
func splitmix(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
