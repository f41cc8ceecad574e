package histo

import (
	"math"
	"sync"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// The prefill cost model (docs/queue-split.md "The prefill cost"): the
// time an engine takes to prefill n new prompt tokens after c cached ones,
//
//	t = t0 + a·n + b·n·(c + n/2)
//
// a fixed cost t0 (scheduling, the first token), a cost a per new token
// (the dense layers) and a cost b per new token and attended position
// (attention: the mean position a new token attends to is c + n/2, so
// prefill per new token grows with the cached context, as measured on
// llama.cpp). It is learned online from every request whose prefill time
// the split knows and whose new tokens the evidence gives: the engine's
// reported cached tokens, else the proxy's own prefix reuse (a turn that
// resends a conversation has reuse r: new ≈ prompt × (1 − r)), else the
// whole prompt. It serves the rate model's split (queue = TTFO − cold
// prefill), the occupancy split's bound on prefill, the abandoned
// prefill's estimate and the inferred cache hits (the new tokens the
// measured prefill time pays for).

// Model parameters. The last 64 samples are kept, so a change of model or
// engine is followed within a few minutes of traffic; 8 make it ready.
// Prompts under 64 new tokens are not learned from: their time is the fixed
// cost, not prefill. A sample more than hitFactor times faster than the
// model predicts is a cache hit the engine did not report and the proxy
// did not know of, and is left out; but modelMinSamples left out in a row
// that agree within hitFactor are the engine's cost, not hits, and replace
// the samples (rateModel.refuse). The fit is redone with every sample
// before the model is ready, then every refitEvery samples, every
// refitFull once the window is full (half of it new): a fit costs a few
// microseconds, a sample a few nanoseconds, and Record learns from most
// requests.
const (
	modelSamples    = 64
	modelMinSamples = 8
	modelMinTokens  = 64
	hitFactor       = 2.0
	refitEvery      = 8
	refitFull       = 32
	// A fit's feature set is used only when its features are not nearly
	// collinear (the determinant of their correlation matrix at least
	// minSpread: about 15% spread in new tokens for t0 against a), and
	// samples more than outlierFactor times the median relative residual
	// off the first fit (and more than minResidual) are left out of the
	// second. The context term is kept when it leaves at most contextGain
	// of the median absolute relative error without it (0.84 ≈ √0.7: 0.7
	// of the squared error, where this rule began).
	minSpread     = 0.02
	outlierFactor = 3.0
	minResidual   = 0.1
	contextGain   = 0.84
	// robustFit's rounds of reweighting at most (it stops once no
	// coefficient moves by robustSettled of itself), and the relative
	// error below which a sample's weight stops growing.
	robustRounds  = 8
	robustSettled = 0.01
	robustFloor   = 0.005
)

// rateSample is one learned prefill: new tokens, the mean position they
// attend to (cached + new/2) and the prefill time in seconds.
type rateSample struct{ n, pos, t float64 }

// costFit is a learned cost model (t = t0 + a·n + b·n·pos, seconds) and
// the slowest, fastest and median (typical) per-token times among the
// samples (n·slowest is the cold bound before the model is ready, n·typical
// the reference a sample is judged by then, n·fastest the prefill floor's
// base).
type costFit struct{ t0, a, b, slowest, fastest, typical float64 }

// cost is the prefill time of n new tokens after cached ones.
func (f costFit) cost(n, cached float64) float64 { return f.t0 + f.a*n + f.b*n*(cached+n/2) }

// newTokens is the prefill time t pays for after cached tokens, at f: the
// inverse of cost in n (cost grows with n over [0, prompt]).
func (f costFit) newTokens(t, prompt float64) float64 {
	t -= f.t0
	switch {
	case t <= 0:
		return 0
	case f.b <= 0:
		return min(t/f.a, prompt)
	}
	// b/2·n² − (a + b·prompt)·n + t = 0, the smaller root.
	p := f.a + f.b*prompt
	d := p*p - 2*f.b*t
	if d <= 0 {
		return prompt
	}
	return min((p-math.Sqrt(d))/f.b, prompt)
}

// rateModel learns the engine's prefill cost online. It is safe for
// concurrent use.
type rateModel struct {
	mu       sync.Mutex
	ring     [modelSamples]rateSample // oldest at next once full
	next, n  int
	run      [modelMinSamples]rateSample // samples refused as hits since the last one learned
	runN     int
	fit      costFit
	ready    bool
	sinceFit int
	scratch  [modelSamples]float64 // refit's
	keep     [modelSamples]bool    // refit's
	weight   [modelSamples]float64 // robustFit's
	resid    [modelSamples]float64 // absResidual's
	// perByte is prompt tokens per request body byte, smoothed: the
	// prompt size of a request without usage (its client left).
	perByte float64
}

// rates is the model read once per Record.
type rates struct {
	fit        costFit
	ready, any bool    // ready: the fit rests on modelMinSamples; any: some sample
	perByte    float64 // prompt tokens per request byte, 0 before any
}

// read takes the model under one lock.
func (m *rateModel) read() rates {
	m.mu.Lock()
	defer m.mu.Unlock()
	return rates{fit: m.fit, ready: m.ready, any: m.n > 0, perByte: m.perByte}
}

// promptParts is tr's prompt split into the tokens the engine had to
// prefill and those it had cached, by the best evidence: its reported
// cached count, else the proxy's prefix reuse (reuse says the prefix was
// sent before, not that the engine kept it: used only when
// withReuse), else none cached. ok is false without a prompt size.
func promptParts(tr *proxy.Trace, withReuse bool) (n, cached float64, ok bool) {
	if tr.PromptTokens < 0 {
		return 0, 0, false
	}
	p := float64(tr.PromptTokens)
	switch {
	case tr.CachedTokens >= 0:
		cached = min(float64(tr.CachedTokens), p)
	case withReuse && tr.Prefix.Tracked && tr.Prefix.Reuse > 0:
		cached = math.Round(p * min(tr.Prefix.Reuse, 1))
	}
	return p - cached, cached, true
}

// learnable reports whether tr may teach the cost model: it succeeded
// with usage and a prompt. It learns tr's tokens per byte then.
func (m *rateModel) learnable(tr *proxy.Trace) bool {
	if tr.Failed() || !tr.UsageSeen || tr.PromptTokens <= 0 {
		return false
	}
	m.learnBytes(tr)
	return true
}

// learn adds tr's prefill time prefill (the split's, when it rests on
// evidence or on the timeline), at its new tokens by promptParts, judged
// against the model rs read before tr was split. The caller checked
// learnable.
func (m *rateModel) learn(tr *proxy.Trace, prefill time.Duration, rs rates) {
	n, cached, _ := promptParts(tr, true)
	m.learnSample(n, cached, prefill.Seconds(), rs)
}

// learnSample adds a prefill of t seconds of n new tokens after cached
// ones, judged against rs: one of fewer than modelMinTokens is left out,
// one more than hitFactor times faster than rs predicts is refused as an
// unknown cache hit.
func (m *rateModel) learnSample(n, cached, t float64, rs rates) {
	if n < modelMinTokens || t <= 0 {
		return
	}
	x := rateSample{n: n, pos: cached + n/2, t: t}
	if rs.any && hitFactor*x.t < reference(rs, n, cached) {
		m.refuse(x)
		return
	}
	m.add(x)
}

// reference is the time a sample of n new tokens is judged by: the model's
// once ready, before it the samples' lower median per-token time (0 with
// one sample: nothing is refused; the faster of two). Judging by the
// slowest's would refuse cold prompts as hits when the engine's own spread
// is wide: against ollama at load average 10, ten equal cold prompts took
// 1.9–4.3 s; the faster ones were refused and the model was not ready
// after all ten (inferred cache null). One sample, or the slower of two,
// may be the engine's first request, which loads the model (ollama:
// 310 ms for 320 tokens against ~70 ms warm): as the reference (the
// median of one, then the mean of two) it made the next seven cold
// prompts cache hits until eight refused in a row agreed (refuse), and
// the model rested on that one sample until then
// (TestRateModelNotLockedByAStall).
func reference(rs rates, n, cached float64) float64 {
	if rs.ready {
		return rs.fit.cost(n, cached)
	}
	return n * rs.fit.typical
}

// lowerMedian is the lower median of sorted (ascending; the faster of the
// two middle per-token times), 0 for fewer than two. The median of all but
// the slowest served the first load as well, but lost 4 of 448 requests
// of the ollama timelines captured in session 8 (P=2 and P=4 bursts and
// 8 agents, quiet host), which the lower median keeps.
func lowerMedian(sorted []float64) float64 {
	if len(sorted) < 2 {
		return 0
	}
	return sorted[(len(sorted)-1)/2]
}

// learnBytes follows tr's prompt tokens per request byte.
func (m *rateModel) learnBytes(tr *proxy.Trace) {
	if tr.ReqBytes <= 0 {
		return
	}
	x := float64(tr.PromptTokens) / float64(tr.ReqBytes)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.perByte == 0 {
		m.perByte = x
		return
	}
	m.perByte += (x - m.perByte) / 16
}

// refuse notes x, a sample left out as a cache hit. Unreported hits save
// different shares of their prompts, so their per-token times scatter; a
// run of modelMinSamples refused in a row that agree within hitFactor is
// instead the engine's cost, and the samples it was judged against were
// the outliers: a stall (ollama loads the model on its first request,
// which is then the slowest sample by far, and the only one the first
// reference rests on) or an engine that got faster. The run
// then replaces the samples, which would otherwise never move again.
func (m *rateModel) refuse(x rateSample) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.run[m.runN] = x
	if m.runN++; m.runN < len(m.run) {
		return
	}
	m.runN = 0
	lo, hi := math.Inf(1), 0.0
	for _, v := range m.run {
		lo, hi = min(lo, v.t/v.n), max(hi, v.t/v.n)
	}
	if hi > hitFactor*lo {
		return // hits of different sizes: go on refusing
	}
	m.n, m.next = 0, 0
	for _, v := range m.run {
		m.addLocked(v)
	}
	m.refitLocked()
}

// add learns x.
func (m *rateModel) add(x rateSample) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.runN = 0 // a sample learned ends a run of refused ones
	m.addLocked(x)
	every := refitEvery
	if m.n == modelSamples {
		every = refitFull
	}
	if m.sinceFit++; !m.ready || m.sinceFit >= every {
		m.refitLocked()
	}
}

// addLocked stores x, evicting the oldest sample once full; the caller
// holds m.mu.
func (m *rateModel) addLocked(x rateSample) {
	m.ring[m.next] = x
	m.next = (m.next + 1) % modelSamples
	m.n = min(m.n+1, modelSamples)
}

// refitLocked fits the cost model to the samples held, twice: the second
// time without the samples far off the first fit (a stall, a prompt the
// engine had cached more or less of than the evidence said). The caller
// holds m.mu.
func (m *rateModel) refitLocked() {
	m.sinceFit = 0
	samples := m.ring[:m.n]
	slowest, fastest := 0.0, math.Inf(1)
	for i, x := range samples {
		slowest, fastest = max(slowest, x.t/x.n), min(fastest, x.t/x.n)
		m.keep[i] = true
	}
	f := m.fitKept(samples)
	res := m.scratch[:len(samples)]
	for i, x := range samples {
		res[i] = math.Abs(x.t-f.cost(x.n, x.pos-x.n/2)) / x.t
	}
	insertionSortFloat(res)
	cut := max(outlierFactor*median(res), minResidual)
	dropped := false
	for i, x := range samples {
		m.keep[i] = math.Abs(x.t-f.cost(x.n, x.pos-x.n/2))/x.t <= cut
		dropped = dropped || !m.keep[i]
	}
	if dropped {
		f = m.fitKept(samples)
	}
	m.fit = f
	m.fit.slowest, m.fit.fastest = slowest, fastest
	per := m.resid[:0]
	for _, x := range samples {
		per = append(per, x.t/x.n)
	}
	insertionSortFloat(per)
	m.fit.typical = lowerMedian(per)
	m.ready = m.n >= modelMinSamples
}

// fitKept fits the samples marked in m.keep: the richest feature set whose
// features are not collinear and whose coefficients are not negative, else
// the median per-token time. The context term must earn its place: a fit
// with it is taken only when it leaves at most contextGain of the
// residual without it, so that noise among turns of one conversation
// (whose context only grows) is not extrapolated into a context cost that
// makes the next, longer turn look slow. The caller holds m.mu.
func (m *rateModel) fitKept(samples []rateSample) costFit {
	c3, r3, ok3 := m.robustFit(samples, [3]bool{true, true, true})
	c2, r2, ok2 := m.robustFit(samples, [3]bool{true, true, false})
	switch {
	case ok3 && (!ok2 || r3 <= contextGain*r2):
		return costFit{t0: c3[0], a: c3[1], b: c3[2]}
	case ok2:
		return costFit{t0: c2[0], a: c2[1]}
	}
	per := m.scratch[:0]
	for i, x := range samples {
		if m.keep[i] {
			per = append(per, x.t/x.n)
		}
	}
	insertionSortFloat(per)
	med := costFit{a: median(per)}
	if c, r, ok := m.robustFit(samples, [3]bool{false, true, true}); ok && r <= contextGain*m.absResidual(samples, [3]float64{0, med.a, 0}) {
		return costFit{a: c[1], b: c[2]}
	}
	return med
}

// robustFit fits t = c0 + c1·n + c2·n·pos over the kept samples with the
// features in use, by least absolute relative error (a median regression:
// iteratively reweighted least squares from the least-squares fit of the
// relative errors). Prefill samples scatter one way: a loaded host, a
// queue read as prefill or a stall make a sample slower, never faster
// than the engine's cost (faster ones, unreported cache hits, are left out
// before), so a least-squares fit leans to the slow ones (a cold
// 1,500-token prompt read 29–35% cached against ollama); the median does
// not. r is the fit's median absolute relative error; ok as for
// leastSquares. The caller holds m.mu.
func (m *rateModel) robustFit(samples []rateSample, use [3]bool) (c [3]float64, r float64, ok bool) {
	for i, x := range samples {
		m.weight[i] = 1 / (x.t * x.t)
	}
	if c, ok = m.leastSquares(samples, use); !ok {
		return c, 0, false
	}
	for range robustRounds {
		f := costFit{t0: c[0], a: c[1], b: c[2]}
		for i, x := range samples {
			e := math.Abs(x.t-f.cost(x.n, x.pos-x.n/2)) / x.t
			m.weight[i] = 1 / (x.t * x.t * max(e, robustFloor))
		}
		next, solved := m.leastSquares(samples, use)
		if !solved {
			break // a coefficient went negative: the last fit stands
		}
		settled := true
		for j := range c {
			settled = settled && math.Abs(next[j]-c[j]) <= robustSettled*math.Abs(c[j])
		}
		if c = next; settled {
			break
		}
	}
	return c, m.absResidual(samples, c), true
}

// absResidual is the median of the kept samples' absolute relative errors
// under c: how well c fits the bulk of them, whatever the slow ones do.
func (m *rateModel) absResidual(samples []rateSample, c [3]float64) float64 {
	f := costFit{t0: c[0], a: c[1], b: c[2]}
	res := m.resid[:0]
	for i, x := range samples {
		if m.keep[i] {
			res = append(res, math.Abs(x.t-f.cost(x.n, x.pos-x.n/2))/x.t)
		}
	}
	insertionSortFloat(res)
	return median(res)
}

// leastSquares fits t = c0 + c1·n + c2·n·pos over the kept samples with
// the features in use, weighting each sample by m.weight. ok is false when
// the features in use are nearly collinear, the samples too few, or a
// coefficient comes out negative (or c1 not positive).
func (m *rateModel) leastSquares(samples []rateSample, use [3]bool) (c [3]float64, ok bool) {
	var idx [3]int
	k := 0
	for j, u := range use {
		if u {
			idx[k] = j
			k++
		}
	}
	var g [3][3]float64 // normal matrix
	var y [3]float64
	kept := 0
	for i, x := range samples {
		if !m.keep[i] {
			continue
		}
		kept++
		f := [3]float64{1, x.n, x.n * x.pos}
		w := m.weight[i]
		for r := range k {
			for s := range k {
				g[r][s] += w * f[idx[r]] * f[idx[s]]
			}
			y[r] += w * f[idx[r]] * x.t
		}
	}
	if kept < 2*k {
		return c, false
	}
	// Collinearity: the determinant of the correlation form of g.
	var corr [3][3]float64
	for r := range k {
		for s := range k {
			corr[r][s] = g[r][s] / math.Sqrt(g[r][r]*g[s][s])
		}
	}
	if det(corr, k) < minSpread {
		return c, false
	}
	sol, solved := solve(g, y, k)
	if !solved {
		return c, false
	}
	for r := range k {
		c[idx[r]] = sol[r]
	}
	if c[0] < 0 || c[1] <= 0 || c[2] < 0 {
		return c, false
	}
	return c, true
}

// det is the determinant of the leading k×k block of a (k ≤ 3).
func det(a [3][3]float64, k int) float64 {
	switch k {
	case 1:
		return a[0][0]
	case 2:
		return a[0][0]*a[1][1] - a[0][1]*a[1][0]
	}
	return a[0][0]*(a[1][1]*a[2][2]-a[1][2]*a[2][1]) - a[0][1]*(a[1][0]*a[2][2]-a[1][2]*a[2][0]) + a[0][2]*(a[1][0]*a[2][1]-a[1][1]*a[2][0])
}

// solve solves the leading k×k system a·x = y by Gaussian elimination with
// partial pivoting.
func solve(a [3][3]float64, y [3]float64, k int) (x [3]float64, ok bool) {
	for col := range k {
		p := col
		for r := col + 1; r < k; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[p][col]) {
				p = r
			}
		}
		if a[p][col] == 0 {
			return x, false
		}
		a[col], a[p] = a[p], a[col]
		y[col], y[p] = y[p], y[col]
		for r := col + 1; r < k; r++ {
			f := a[r][col] / a[col][col]
			for s := col; s < k; s++ {
				a[r][s] -= f * a[col][s]
			}
			y[r] -= f * y[col]
		}
	}
	for r := k - 1; r >= 0; r-- {
		v := y[r]
		for s := r + 1; s < k; s++ {
			v -= a[r][s] * x[s]
		}
		x[r] = v / a[r][r]
	}
	return x, true
}

// median of ascending a (0 when empty).
func median(a []float64) float64 {
	n := len(a)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return a[n/2]
	}
	return (a[n/2-1] + a[n/2]) / 2
}

// insertionSortFloat sorts a few values ascending.
func insertionSortFloat(a []float64) {
	for i := 1; i < len(a); i++ {
		x, j := a[i], i
		for ; j > 0 && a[j-1] > x; j-- {
			a[j] = a[j-1]
		}
		a[j] = x
	}
}

// rate is the learned cold rate, new tokens per second at no context
// (1/a), and whether the model is ready.
func (m *rateModel) rate() (float64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready || m.fit.a <= 0 {
		return 0, false
	}
	return 1 / m.fit.a, true
}

// samples returns the number of samples held.
func (m *rateModel) samples() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// PrefillRate returns the learned cold prefill rate in new prompt tokens
// per second (without context: the cost model's per-token term) and the
// number of samples it rests on; ok is false until there are enough
// samples for SourceModel and inferred cache hits. Safe for concurrent
// use.
func (r *Recorder) PrefillRate() (rate float64, samples int, ok bool) {
	rate, ok = r.model.rate()
	return rate, r.model.samples(), ok
}

// estimate is the time tr's uncached prompt (by its reported cached
// tokens only: this is the cold bound) takes to prefill at the model rs.
// With ready, only a ready model answers (the split's fallback); otherwise
// any sample does, the slowest per-token time standing for the model until
// there are enough (the occupancy split's bound on prefill).
func estimate(tr *proxy.Trace, rs rates, ready bool) (time.Duration, bool) {
	n, cached, known := promptParts(tr, false)
	if !known {
		return 0, false
	}
	switch {
	case rs.ready:
		return seconds(rs.fit.cost(n, cached)), true
	case ready || !rs.any || n < modelMinTokens:
		return 0, false
	}
	return seconds(n * rs.fit.slowest), true
}

// floorShare is the share of the evidence's prefill estimate that a
// prefill is never below once the model is ready (a host under load only
// makes prefill slower); floorEarly before, from the fastest sample: a
// sample twice as fast as that is a cache hit the evidence did not know of
// (hitFactor).
const (
	floorShare = 0.7
	floorEarly = 1 / hitFactor
)

// prefillPoint is what tr's prefill should take by the evidence, and a
// lower bound on it (floor); both 0 when there is none. The new tokens by
// the evidence are its reported cached tokens, else the proxy's prefix
// reuse: only a prompt whose prefix the proxy saw sent before can be
// cached, unless it reached the engine another way. Without reported
// cached tokens or a tracked prefix, the engine may have cached any of it:
// no estimate. The model's time is the point and floorShare of it the
// floor; before the model is ready, the fastest sample's per-token time
// (a slow one may hold a queue misread as prefill) and floorEarly of it.
// Where the engine reports no cached tokens the floor is also never above
// floorShare of the fastest sample's per-token time: there the fit is no
// lower bound. ollama (no cached count on its OpenAI routes) runs the
// prompts that waited for its batch lock together, each timed as if it
// were alone, and a fit learned from them put a prefill that ran alone in
// 272 ms at 738 (agents-p4-s19run01 request 13; 270 at 424,
// agents-p4-s18run01 request 13): the floor rejected the end each waited
// for and sent it to the lock, 975 and 537 ms early. Samples that agree
// (a fastest per-token time near the fit's) leave the floor as it was.
// The engine's own report of the prefill (llama.cpp timings.prompt_ms,
// vLLM's per-request metrics, ollama's prompt_eval_duration) comes
// before any of that: it is the prefill, where the model's cost can be a
// third of it (llama-server's attention over a few thousand tokens on a
// small model grows with the prompt's square); the floor keeps its share,
// and exact says the point is that report.
func prefillPoint(tr *proxy.Trace, rs rates) (point, floor time.Duration, exact bool) {
	if tr.ServerPrefill > 0 {
		return tr.ServerPrefill, time.Duration(floorShare * float64(tr.ServerPrefill)), true
	}
	if !rs.any || (tr.CachedTokens < 0 && !tr.Prefix.Tracked) {
		return 0, 0, false
	}
	n, cached, ok := promptParts(tr, true)
	if !ok || n < modelMinTokens {
		return 0, 0, false
	}
	t := n * rs.fit.fastest
	if rs.ready {
		t = rs.fit.cost(n, cached)
	}
	return seconds(t), seconds(prefillFloor(rs, n, cached, tr.CachedTokens >= 0)), false
}

// prefillFloor is the least time, in seconds, a prefill of n new tokens
// after cached ones takes by the model rs (prefillPoint): floorShare of
// the model's cost once ready, where the engine reported its cached
// tokens (reported), else of the lesser of that and the fastest sample's
// per-token time; floorEarly of the fastest sample's before. 0 before
// any sample, and for fewer than modelMinTokens.
func prefillFloor(rs rates, n, cached float64, reported bool) float64 {
	switch {
	case !rs.any || n < modelMinTokens:
		return 0
	case !rs.ready:
		return floorEarly * n * rs.fit.fastest
	case reported:
		return floorShare * rs.fit.cost(n, cached)
	}
	return floorShare * min(rs.fit.cost(n, cached), n*rs.fit.fastest)
}

// abandonedPrefill is how long the engine takes, from its start, to
// prefill tr, whose client left before its first output (ollama and llama.cpp prefill the
// whole prompt, or the batch they are on, before they notice), from the
// model: 0 when tr is not such a request or nothing is learned yet. A
// request without usage is sized from its body at the learned tokens per
// byte; the proxy's prefix reuse stands for what the engine had cached.
func (r *Recorder) abandonedPrefill(tr *proxy.Trace, rs rates) time.Duration {
	if tr.ErrKind != proxy.ErrClientGone || !tr.FirstOutput.IsZero() || !rs.any {
		return 0
	}
	t := *tr
	if t.PromptTokens < 0 {
		if rs.perByte <= 0 || tr.ReqBytes <= 0 {
			return 0
		}
		t.PromptTokens = int64(float64(tr.ReqBytes) * rs.perByte)
	}
	n, cached, _ := promptParts(&t, true)
	if rs.ready {
		return seconds(rs.fit.cost(n, cached))
	}
	return seconds(n * rs.fit.slowest)
}

// freshShare: a prompt of which the proxy saw no earlier request send
// more than this share is new to the engine (its chat template aside).
const freshShare = 0.05

// freshPrompt reports whether tr's prompt is new to the engine by the
// evidence: it reported no cached tokens, or, reporting none, the proxy
// saw no earlier request send more than freshShare of it. No cache hit
// the evidence missed can then have shortened its prefill.
func freshPrompt(tr *proxy.Trace) bool {
	if tr.CachedTokens >= 0 {
		return tr.CachedTokens == 0
	}
	return tr.Prefix.Tracked && tr.Prefix.Reuse >= 0 && tr.Prefix.Reuse < freshShare // -1: unknown
}

// seconds is s seconds as a Duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// refereed is the slot cache's count of tr's cached tokens, cached, or
// alt, what tr gets had another request taken its slot first, whichever
// the measured prefill is nearer to at the model rs (by the ratio of the
// times). Only a request still in flight when tr was recorded (inFlight:
// admitted before it, its prompt not read yet) can have done so unseen;
// without one, alt needs the prefill to deny cached too (more than
// hitFactor times slower than its cost, the bound at which a sample is
// refused as a hit), the split's start times having placed tr. cached
// when the split or the model cannot say. Against ollama on 4 slots a
// turn given its own previous slot by the replay had found it taken by a
// request recorded after it (used=624 of 1,369 where the replay said
// 1,194), its prefill 486 ms where the cost model said about half.
func refereed(cached, alt int64, inFlight bool, tr *proxy.Trace, sp split, rs rates) int64 {
	if cached == alt || !sp.OK || !rs.any || tr.PromptTokens <= max(cached, alt) {
		return cached
	}
	t := sp.Prefill.Seconds()
	ec := reference(rs, float64(tr.PromptTokens-cached), float64(cached))
	ea := reference(rs, float64(tr.PromptTokens-alt), float64(alt))
	if t <= 0 || ec <= 0 || ea <= 0 || !inFlight && t <= hitFactor*ec || math.Abs(math.Log(t/ea)) >= math.Abs(math.Log(t/ec)) {
		return cached
	}
	return alt
}

// measuredPrefill reports whether tr's prefill time was measured, not
// assumed (a split from the model or the engine's load takes the prompt
// as cold), and its prompt is long enough for a cache figure.
func measuredPrefill(tr *proxy.Trace, sp split) bool {
	return sp.OK && sp.Source != SourceModel && sp.Source != SourceEngineLoad && tr.PromptTokens >= modelMinTokens
}

// inferCached estimates, at the model rs, the prompt tokens tr had from
// the engine's prefix cache: the prompt minus the new tokens the measured
// prefill time pays for. -1 when it cannot be estimated (no split, a split
// from the model, which assumes a cold prompt, no prompt size, too short a
// prompt, or a model not ready).
func inferCached(tr *proxy.Trace, sp split, rs rates) int64 {
	if !measuredPrefill(tr, sp) || !rs.ready {
		return -1
	}
	p := float64(tr.PromptTokens)
	n := rs.fit.newTokens(sp.Prefill.Seconds(), p)
	return min(max(tr.PromptTokens-int64(n+0.5), 0), tr.PromptTokens)
}
