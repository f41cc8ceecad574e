package main

import (
	"math"
	"testing"
)

// A reference forward pass of the llama architecture in plain Go (RMS norm,
// RoPE, causal multi-head attention, SwiGLU), used only to check that the
// generated weights behave as designed before ollama ever loads them:
// sampling emits words and ends by itself; greedy decoding repeats one
// token (which is what makes ollama cut the stream).
type ref struct {
	w map[string][]float32
	v *vocab
}

func newRef(seed uint64) *ref {
	v := newVocab()
	r := &ref{w: map[string][]float32{}, v: v}
	for _, t := range newTensors(v, seed) {
		r.w[t.Name] = t.Data
	}
	return r
}

func rmsNorm(x, g []float32) []float32 {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	s := float32(1 / math.Sqrt(ss/float64(len(x))+rmsEps))
	out := make([]float32, len(x))
	for i := range x {
		out[i] = x[i] * s * g[i]
	}
	return out
}

// matvec computes W x for W of out rows of len(x) values.
func matvec(w, x []float32) []float32 {
	out := make([]float32, len(w)/len(x))
	for o := range out {
		var s float32
		for i, xv := range x {
			s += w[o*len(x)+i] * xv
		}
		out[o] = s
	}
	return out
}

func rope(x []float32, pos int) {
	hd := nEmbd / nHead
	for h := range nHead {
		for i := 0; i < hd; i += 2 {
			th := float64(pos) * math.Pow(ropeBase, -float64(i)/float64(hd))
			c, s := float32(math.Cos(th)), float32(math.Sin(th))
			a, b := x[h*hd+i], x[h*hd+i+1]
			x[h*hd+i], x[h*hd+i+1] = a*c-b*s, a*s+b*c
		}
	}
}

// run feeds tokens and then generates up to n more with pick, returning
// the generated ids (ending with </s> if it came).
func (r *ref) run(prompt []int, n int, pick func([]float32) int) []int {
	type kvc struct{ k, v [][]float32 }
	cache := make([]kvc, nLayer)
	var out []int
	tok := prompt[0]
	for pos := 0; ; pos++ {
		x := append([]float32(nil), r.w["token_embd.weight"][tok*nEmbd:(tok+1)*nEmbd]...)
		for l := range nLayer {
			p := "blk." + itoa(l) + "."
			h := rmsNorm(x, r.w[p+"attn_norm.weight"])
			q, k, v := matvec(r.w[p+"attn_q.weight"], h), matvec(r.w[p+"attn_k.weight"], h), matvec(r.w[p+"attn_v.weight"], h)
			rope(q, pos)
			rope(k, pos)
			cache[l].k, cache[l].v = append(cache[l].k, k), append(cache[l].v, v)
			att := make([]float32, nEmbd)
			hd := nEmbd / nHead
			for hh := range nHead {
				sc := make([]float64, pos+1)
				mx := math.Inf(-1)
				for j := range sc {
					var d float32
					for i := range hd {
						d += q[hh*hd+i] * cache[l].k[j][hh*hd+i]
					}
					sc[j] = float64(d) / math.Sqrt(float64(hd))
					mx = math.Max(mx, sc[j])
				}
				var z float64
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					z += sc[j]
				}
				for j := range sc {
					for i := range hd {
						att[hh*hd+i] += float32(sc[j]/z) * cache[l].v[j][hh*hd+i]
					}
				}
			}
			o := matvec(r.w[p+"attn_output.weight"], att)
			for i := range x {
				x[i] += o[i]
			}
			h = rmsNorm(x, r.w[p+"ffn_norm.weight"])
			g, u := matvec(r.w[p+"ffn_gate.weight"], h), matvec(r.w[p+"ffn_up.weight"], h)
			for i := range g {
				g[i] = g[i] / (1 + float32(math.Exp(float64(-g[i])))) * u[i]
			}
			d := matvec(r.w[p+"ffn_down.weight"], g)
			for i := range x {
				x[i] += d[i]
			}
		}
		if pos+1 < len(prompt) {
			tok = prompt[pos+1]
			continue
		}
		tok = pick(matvec(r.w["output.weight"], rmsNorm(x, r.w["output_norm.weight"])))
		out = append(out, tok)
		if tok == eosID || len(out) == n {
			return out
		}
	}
}

func argmax(l []float32) int {
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return best
}

func sampler(seed uint64) func([]float32) int {
	r := &rng{s: seed}
	return func(l []float32) int {
		mx := l[argmax(l)]
		p := make([]float64, len(l))
		var z float64
		for i, v := range l {
			p[i] = math.Exp(float64(v - mx))
			z += p[i]
		}
		u := float64(r.next()>>11) / (1 << 53) * z
		for i := range p {
			if u -= p[i]; u < 0 {
				return i
			}
		}
		return len(p) - 1
	}
}

// prompt is <s> followed by some single-character pieces.
func testPrompt(r *ref, n int, seed uint64) []int {
	g := &rng{s: seed}
	p := []int{bosID}
	for range n {
		p = append(p, firstPieceID+int(g.next()%uint64(len(r.v.Tokens)-firstPieceID)))
	}
	return p
}

func TestSampledAnswersAreWordsAndEnd(t *testing.T) {
	r := newRef(defaultSeed)
	const runs, limit = 24, 400
	total, ended := 0, 0
	for i := range runs {
		out := r.run(testPrompt(r, 20, uint64(i)), limit, sampler(uint64(100+i)))
		for _, id := range out {
			if k := r.v.kind(id); k == kindNever {
				t.Fatalf("run %d sampled never-token %d %q", i, id, r.v.Tokens[id])
			}
		}
		if out[len(out)-1] == eosID {
			ended++
		}
		total += len(out)
	}
	mean := float64(total) / runs
	t.Logf("%d/%d answers ended with </s>; mean length %.1f tokens", ended, runs, mean)
	if ended < runs*9/10 || mean < 8 || mean > 100 {
		t.Fatalf("%d/%d ended, mean %.1f tokens: want nearly all to end after a few dozen tokens", ended, runs, mean)
	}
}

func TestGreedyRepeatsTheAttractor(t *testing.T) {
	r := newRef(defaultSeed)
	for i, n := range []int{5, 20, 60, 200} {
		out := r.run(testPrompt(r, n, uint64(i)), 40, argmax)
		for j, id := range out {
			if r.v.Tokens[id] != sp+attractor {
				t.Fatalf("prompt %d: greedy token %d is %q, want %q every time (ollama cuts after 30 repeats)", i, j, r.v.Tokens[id], sp+attractor)
			}
		}
	}
}
