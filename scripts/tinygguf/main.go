// Command tinygguf writes the tiny random-weight llama model the real-engine
// conformance suite serves with ollama (scripts/real-engine.sh,
// docs/real-engine.md): GGUF v3, 2 layers, embedding 64, 4 heads,
// feed-forward 128, F32, a byte-fallback SentencePiece vocabulary of ~430
// tokens. Its output is words, and a sampled answer ends by itself after a
// few dozen tokens. The same seed gives the same bytes.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// defaultSeed fixes the published model; change it only on purpose.
const defaultSeed = 42

func main() {
	out := flag.String("o", "tiny.gguf", "output file")
	seed := flag.Uint64("seed", defaultSeed, "weight seed")
	flag.Parse()
	if err := writeFile(*out, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "tinygguf:", err)
		os.Exit(1)
	}
}

// writeFile writes the model to path through a temporary file, so a reader
// never sees half a model.
func writeFile(path string, seed uint64) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tinygguf-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := newModel(seed).writeTo(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// newModel is the whole GGUF file: metadata, then tensors.
func newModel(seed uint64) *file {
	v := newVocab()
	return &file{
		KVs: []kv{
			{"general.architecture", "llama"},
			{"general.name", "anvilproxy-tiny"},
			{"general.file_type", uint32(0)}, // all F32
			{"general.alignment", uint32(ggufAlignment)},
			{"llama.vocab_size", uint32(len(v.Tokens))},
			{"llama.context_length", uint32(nCtx)},
			{"llama.embedding_length", uint32(nEmbd)},
			{"llama.block_count", uint32(nLayer)},
			{"llama.feed_forward_length", uint32(nFF)},
			{"llama.attention.head_count", uint32(nHead)},
			{"llama.attention.head_count_kv", uint32(nHead)},
			{"llama.attention.layer_norm_rms_epsilon", float32(rmsEps)},
			{"llama.rope.dimension_count", uint32(nEmbd / nHead)},
			{"llama.rope.freq_base", float32(ropeBase)},
			{"tokenizer.ggml.model", "llama"},
			{"tokenizer.ggml.tokens", v.Tokens},
			{"tokenizer.ggml.scores", v.Scores},
			{"tokenizer.ggml.token_type", v.Types},
			{"tokenizer.ggml.unknown_token_id", uint32(unkID)},
			{"tokenizer.ggml.bos_token_id", uint32(bosID)},
			{"tokenizer.ggml.eos_token_id", uint32(eosID)},
			{"tokenizer.ggml.add_bos_token", true},
			{"tokenizer.ggml.add_eos_token", false},
		},
		Tensors: newTensors(v, seed),
	}
}
