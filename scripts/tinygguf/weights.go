package main

// Weights are random but shaped so that sampling behaves: embedding
// dimension 0 is a constant "bias channel" that no layer reads or writes,
// so after the final RMS norm it carries about the same value at every
// position, and the output layer's column 0 turns it into a fixed logit
// bias per token (see bias). Everything else is small uniform noise.

const (
	// biasEmbed is embedding dimension 0 for every token. It dominates the
	// residual stream's RMS, so the normalized value is close to
	// sqrt(nEmbd) = 8 whatever the noise does.
	biasEmbed = 4
	// biasNorm is that normalized value, used to turn a wanted logit bias
	// into an output weight.
	biasNorm = 8
	// Noise amplitudes (uniform in ±a). Small enough that the bias channel
	// keeps dominating the RMS.
	embedNoise  = 0.3
	attnNoise   = 0.15
	ffnNoise    = 0.15
	outputNoise = 0.35
)

// bias is the logit each token kind gets from the bias channel. Never-
// sampled tokens sit far below everything; the attractor sits above every
// word by more than the noise, so greedy decoding repeats it (and ollama
// cuts the stream after 30 repeats) while sampling still picks other words
// most of the time; </s> is likely enough that a sampled answer ends after
// a few dozen tokens.
var bias = map[kind]float32{
	kindNever:     -80,
	kindEOS:       2.0,
	kindAttractor: 4,
	kindWord:      0,
	kindChar:      -2,
}

// rng is splitmix64: tiny, and its sequence is fixed by this file (not by
// a library version), so the model's bytes are too.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform returns a value in [-a, a).
func (r *rng) uniform(a float32) float32 {
	return a * (2*float32(r.next()>>40)/float32(1<<24) - 1)
}

// matrix returns an out×in weight (ggml dims {in, out}) of noise. With
// skipIn, input column 0 is zero (the layer does not read the bias
// channel); with skipOut, output row 0 is zero (it does not write it).
func (r *rng) matrix(in, out int, a float32, skipIn, skipOut bool) []float32 {
	w := make([]float32, in*out)
	for o := range out {
		for i := range in {
			v := r.uniform(a)
			if (skipIn && i == 0) || (skipOut && o == 0) {
				v = 0
			}
			w[o*in+i] = v
		}
	}
	return w
}

func ones(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// newTensors builds every tensor of the model for vocabulary v from seed.
func newTensors(v *vocab, seed uint64) []tensor {
	r := &rng{s: seed}
	nVocab := len(v.Tokens)
	embd := r.matrix(nEmbd, nVocab, embedNoise, false, false)
	for t := range nVocab {
		embd[t*nEmbd] = biasEmbed
	}
	ts := []tensor{{"token_embd.weight", dims(nEmbd, nVocab), embd}}
	for l := range nLayer {
		p := func(s string) string { return "blk." + itoa(l) + "." + s + ".weight" }
		ts = append(ts,
			tensor{p("attn_norm"), dims(nEmbd), ones(nEmbd)},
			tensor{p("attn_q"), dims(nEmbd, nEmbd), r.matrix(nEmbd, nEmbd, attnNoise, true, false)},
			tensor{p("attn_k"), dims(nEmbd, nEmbd), r.matrix(nEmbd, nEmbd, attnNoise, true, false)},
			tensor{p("attn_v"), dims(nEmbd, nEmbd), r.matrix(nEmbd, nEmbd, attnNoise, true, false)},
			tensor{p("attn_output"), dims(nEmbd, nEmbd), r.matrix(nEmbd, nEmbd, attnNoise, false, true)},
			tensor{p("ffn_norm"), dims(nEmbd), ones(nEmbd)},
			tensor{p("ffn_gate"), dims(nEmbd, nFF), r.matrix(nEmbd, nFF, ffnNoise, true, false)},
			tensor{p("ffn_up"), dims(nEmbd, nFF), r.matrix(nEmbd, nFF, ffnNoise, true, false)},
			tensor{p("ffn_down"), dims(nFF, nEmbd), r.matrix(nFF, nEmbd, ffnNoise, false, true)},
		)
	}
	out := r.matrix(nEmbd, nVocab, outputNoise, false, false)
	for t := range nVocab {
		k := v.kind(t)
		if k == kindEOS || k == kindAttractor {
			// No noise: their logits follow the bias channel alone, so
			// the context cannot push them around.
			clear(out[t*nEmbd : (t+1)*nEmbd])
		}
		out[t*nEmbd] = bias[k] / biasNorm
	}
	return append(ts,
		tensor{"output_norm.weight", dims(nEmbd), ones(nEmbd)},
		tensor{"output.weight", dims(nEmbd, nVocab), out},
	)
}

func dims(d ...int) []uint64 {
	u := make([]uint64, len(d))
	for i, v := range d {
		u[i] = uint64(v)
	}
	return u
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + itoa(i%10)
}
