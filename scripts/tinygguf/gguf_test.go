package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// parsed is a GGUF file read back by an independent reader (this file's,
// not the writer's code).
type parsed struct {
	version uint32
	kvs     map[string]any
	order   []string
	tensors []parsedTensor
	data    []byte // from the aligned start of tensor data
}

type parsedTensor struct {
	name   string
	dims   []uint64
	typ    uint32
	offset uint64
}

type reader struct {
	b   []byte
	off int
}

func (r *reader) take(n int) []byte {
	if r.off+n > len(r.b) {
		panic(io.ErrUnexpectedEOF)
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.take(8)) }
func (r *reader) str() string { return string(r.take(int(r.u64()))) }

func (r *reader) value(typ uint32) any {
	switch typ {
	case typeUint32:
		return r.u32()
	case typeInt32:
		return int32(r.u32())
	case typeFloat32:
		return math.Float32frombits(r.u32())
	case typeBool:
		return r.take(1)[0] == 1
	case typeString:
		return r.str()
	case typeArray:
		elem, n := r.u32(), r.u64()
		out := make([]any, n)
		for i := range out {
			out[i] = r.value(elem)
		}
		return out
	}
	panic(fmt.Sprintf("unknown metadata type %d", typ))
}

func parse(t *testing.T, b []byte) (p parsed) {
	t.Helper()
	defer func() {
		if e := recover(); e != nil {
			t.Fatalf("parse: %v", e)
		}
	}()
	r := &reader{b: b}
	if magic := string(r.take(4)); magic != "GGUF" {
		t.Fatalf("magic %q", magic)
	}
	p.version = r.u32()
	nt, nkv := r.u64(), r.u64()
	p.kvs = map[string]any{}
	for range nkv {
		k := r.str()
		p.kvs[k] = r.value(r.u32())
		p.order = append(p.order, k)
	}
	for range nt {
		var pt parsedTensor
		pt.name = r.str()
		pt.dims = make([]uint64, r.u32())
		for i := range pt.dims {
			pt.dims[i] = r.u64()
		}
		pt.typ, pt.offset = r.u32(), r.u64()
		p.tensors = append(p.tensors, pt)
	}
	start := (r.off + 31) / 32 * 32
	p.data = b[start:]
	return p
}

func model(t *testing.T, seed uint64) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := newModel(seed).writeTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestHeaderAndMetadata(t *testing.T) {
	p := parse(t, model(t, defaultSeed))
	if p.version != 3 {
		t.Fatalf("version %d, want 3", p.version)
	}
	want := map[string]any{
		"general.architecture":                   "llama",
		"llama.context_length":                   uint32(32768),
		"llama.embedding_length":                 uint32(64),
		"llama.block_count":                      uint32(2),
		"llama.feed_forward_length":              uint32(128),
		"llama.attention.head_count":             uint32(4),
		"llama.attention.head_count_kv":          uint32(4),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"tokenizer.ggml.model":                   "llama",
		"tokenizer.ggml.bos_token_id":            uint32(1),
		"tokenizer.ggml.eos_token_id":            uint32(2),
		"tokenizer.ggml.add_bos_token":           true,
	}
	for k, v := range want {
		if p.kvs[k] != v {
			t.Errorf("%s = %v (%T), want %v", k, p.kvs[k], p.kvs[k], v)
		}
	}
	toks := p.kvs["tokenizer.ggml.tokens"].([]any)
	types := p.kvs["tokenizer.ggml.token_type"].([]any)
	scores := p.kvs["tokenizer.ggml.scores"].([]any)
	if len(toks) != len(types) || len(toks) != len(scores) {
		t.Fatalf("tokens %d, types %d, scores %d", len(toks), len(types), len(scores))
	}
	if p.kvs["llama.vocab_size"] != uint32(len(toks)) {
		t.Errorf("vocab_size %v, %d tokens", p.kvs["llama.vocab_size"], len(toks))
	}
	for id, tok := range map[int]string{0: "<unk>", 1: "<s>", 2: "</s>", 3: "<0x00>", 3 + 0x41: "<0x41>", 258: "<0xFF>", 259: "\u2581"} {
		if toks[id] != tok {
			t.Errorf("token %d = %q, want %q", id, toks[id], tok)
		}
	}
	counts := map[int32]int{}
	for _, ty := range types {
		counts[ty.(int32)]++
	}
	if counts[tokByte] != 256 || counts[tokControl] != 2 || counts[tokUnknown] != 1 || counts[tokNormal] < 130 || counts[tokNormal] > 200 {
		t.Errorf("token types %v: want 256 byte, 2 control, 1 unknown, ~140 normal", counts)
	}
	seen := map[string]bool{}
	for _, tok := range toks {
		if seen[tok.(string)] {
			t.Errorf("duplicate token %q", tok)
		}
		seen[tok.(string)] = true
	}
}

func TestTensorTable(t *testing.T) {
	b := model(t, defaultSeed)
	p := parse(t, b)
	nVocab := uint64(len(p.kvs["tokenizer.ggml.tokens"].([]any)))
	want := map[string][]uint64{
		"token_embd.weight":  {64, nVocab},
		"output_norm.weight": {64},
		"output.weight":      {64, nVocab},
	}
	for l := range 2 {
		pre := fmt.Sprintf("blk.%d.", l)
		for name, d := range map[string][]uint64{
			"attn_norm": {64}, "ffn_norm": {64},
			"attn_q": {64, 64}, "attn_k": {64, 64}, "attn_v": {64, 64}, "attn_output": {64, 64},
			"ffn_gate": {64, 128}, "ffn_up": {64, 128}, "ffn_down": {128, 64},
		} {
			want[pre+name+".weight"] = d
		}
	}
	if len(p.tensors) != len(want) {
		t.Fatalf("%d tensors, want %d", len(p.tensors), len(want))
	}
	var end uint64
	for i, pt := range p.tensors {
		d, ok := want[pt.name]
		if !ok || fmt.Sprint(d) != fmt.Sprint(pt.dims) {
			t.Errorf("tensor %s dims %v, want %v", pt.name, pt.dims, d)
		}
		if pt.typ != 0 || pt.offset%32 != 0 || pt.offset < end {
			t.Errorf("tensor %s: type %d offset %d (previous ended at %d)", pt.name, pt.typ, pt.offset, end)
		}
		end = pt.offset + 4*elems(pt.dims)
		if i == len(p.tensors)-1 && uint64(len(p.data)) < end {
			t.Errorf("data %d bytes, last tensor ends at %d", len(p.data), end)
		}
	}
	if len(b) > 1<<20 {
		t.Errorf("model is %d bytes, want about 0.5 MB", len(b))
	}
}

func TestDeterministic(t *testing.T) {
	a, b := model(t, defaultSeed), model(t, defaultSeed)
	if !bytes.Equal(a, b) {
		t.Fatal("two writes with the same seed differ")
	}
	if bytes.Equal(a, model(t, defaultSeed+1)) {
		t.Fatal("another seed gave the same bytes")
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := writeFile(path, defaultSeed); err != nil {
		t.Fatal(err)
	}
	if c, err := os.ReadFile(path); err != nil || !bytes.Equal(a, c) {
		t.Fatalf("file differs from the in-memory model (err %v)", err)
	}
}

// floats reads tensor name's data back from the file.
func (p *parsed) floats(t *testing.T, name string) []float32 {
	t.Helper()
	for _, pt := range p.tensors {
		if pt.name == name {
			n := elems(pt.dims)
			out := make([]float32, n)
			for i := range out {
				out[i] = math.Float32frombits(binary.LittleEndian.Uint32(p.data[pt.offset+4*uint64(i):]))
			}
			return out
		}
	}
	t.Fatalf("no tensor %s", name)
	return nil
}

// TestBiasChannel reads the weights back: dimension 0 of every embedding is
// the constant, no layer writes it, and the output layer's column 0 holds
// each token kind's bias.
func TestBiasChannel(t *testing.T) {
	p := parse(t, model(t, defaultSeed))
	toks := p.kvs["tokenizer.ggml.tokens"].([]any)
	embd := p.floats(t, "token_embd.weight")
	for tok := range toks {
		if embd[tok*64] != biasEmbed {
			t.Fatalf("token %d: embedding[0] = %v, want %v", tok, embd[tok*64], biasEmbed)
		}
	}
	for l := range 2 {
		for _, name := range []string{"attn_output", "ffn_down"} {
			w := p.floats(t, fmt.Sprintf("blk.%d.%s.weight", l, name))
			in := len(w) / 64
			for i := range in {
				if w[i] != 0 {
					t.Fatalf("blk.%d.%s writes dimension 0 (input %d: %v)", l, name, i, w[i])
				}
			}
		}
	}
	out := p.floats(t, "output.weight")
	for tok, want := range map[int]float32{1: -10, 3: -10, 258: -10, 2: bias[kindEOS] / biasNorm, 260: bias[kindAttractor] / biasNorm} {
		if out[tok*64] != want {
			t.Errorf("token %d %q: output weight[0] = %v, want %v", tok, toks[tok], out[tok*64], want)
		}
	}
	if toks[260] != "\u2581"+attractor {
		t.Errorf("token 260 is %q, want the attractor", toks[260])
	}
}
