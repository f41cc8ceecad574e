package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

func runSim(args []string, stderr io.Writer) error {
	c, listen, err := parseSimFlags(args, stderr)
	if err != nil {
		return err
	}
	s, err := sim.New(c)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	c = s.Config() // defaults and the engine's choices filled in
	fmt.Fprintf(stderr, "anvilproxy sim: serving %s on http://%s (engine %s, slots %d, prefill %.0f tok/s, decode %.0f tok/s)\n",
		c.Model, ln.Addr(), c.Engine, c.Slots, c.PrefillTokensPerSec, c.DecodeTokensPerSec)
	hs := s.HTTPServer()
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigc)
	go func() {
		<-sigc
		hs.Close()
	}()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// parseSimFlags parses the sim subcommand's flags into the engine's
// configuration and the address to listen on.
func parseSimFlags(args []string, stderr io.Writer) (c sim.Config, listen string, err error) {
	fs := newFlagSet("sim", "", stderr)
	fs.StringVar(&listen, "listen", ":8000", "address the simulated engine listens on (host:port)")
	fs.StringVar(&c.Model, "model", sim.DefaultModel, "model name reported in responses")
	fs.TextVar(&c.Engine, "engine", sim.EngineVLLM, "engine to behave like: vllm, llamacpp or ollama (defaults of --cache, --release, ...)")
	fs.TextVar(&c.Cache, "cache", sim.CacheAuto, "prefix cache: shared (vLLM blocks), slot (each slot keeps its last prompt; the longest-prefix free slot is chosen, as llama.cpp and ollama) or auto (the engine's)")
	fs.TextVar(&c.Release, "release", sim.ReleaseAuto, "when a slot is let go: last-token (vLLM), stream-end (one decode step later, with the final chunk: llama.cpp, ollama) or auto (the engine's)")
	fs.TextVar(&c.Abandon, "abandon", sim.AbandonAuto, "a prefill whose client left: stop (vLLM), batch (finish the --batch-tokens batch: llama.cpp), prompt (the whole prompt: ollama) or auto (the engine's)")
	fs.IntVar(&c.BatchTokens, "batch-tokens", 2048, "prefill batch that --abandon batch finishes")
	fs.TextVar(&c.BatchLock, "batch-lock", sim.LockAuto, "a slot start while another request prefills: none (at once: vLLM, llama.cpp), prefill (waits for the prefills under way: ollama's llamarunner) or auto (the engine's)")
	fs.BoolVar(&c.SharedPrefill, "shared-prefill", false, "the prefills share the engine's compute: with --batch-lock prefill those that start together, each taking the sum over them of min(its solo time, theirs), as llamarunner's batches; with none one after another in the order they began, as llama.cpp's batches and vLLM's chunked prefill roughly do (they also give a batch's leftover tokens to the next prompts, which can then end sooner); off, each runs at its own speed")
	fs.DurationVar(&c.ArrivalJitter, "arrival-jitter", 0, "requests arriving within this of each other reach the queue in random order (as ollama's server handlers); 0: none")
	fs.DurationVar(&c.SwitchCost, "switch-cost", 0, "llama.cpp RAM prompt cache: cost of each save or restore on a slot switch, before the prefill; 0: the engine's (llamacpp 15ms), negative: no RAM cache")
	fs.Float64Var(&c.ContextSlowdown, "context-slowdown", 0, "prefill cost per new token grows by this fraction per 1,000 tokens of context; 0: the engine's (llamacpp, ollama 0.1), negative: none")
	fs.TextVar(&c.Metrics, "metrics", sim.MetricsAuto, "GET /metrics form: vllm (vllm:num_requests_running …), llamacpp (llamacpp:requests_processing …), none (404, as ollama) or auto (the engine's)")
	fs.IntVar(&c.KVCacheTokens, "kv-cache-tokens", 0, "continuous batching: admit a request only while the prompt+completion tokens of those running fit in this KV cache (FCFS, as vLLM); 0: slots only")
	fs.IntVar(&c.Slots, "slots", 4, "concurrent sequences; more requests wait in a FIFO queue")
	fs.IntVar(&c.MaxQueue, "max-queue", 64, "requests that may wait for a slot; one more gets 429")
	fs.Float64Var(&c.PrefillTokensPerSec, "prefill-tps", 7700, "prefill rate of uncached prompt tokens, tokens/s")
	fs.Float64Var(&c.DecodeTokensPerSec, "decode-tps", 235, "decode rate per stream, tokens/s")
	fs.IntVar(&c.TokensPerEvent, "tokens-per-event", 5, "mean tokens per SSE event (speculative decoding sends several)")
	fs.Var((*lengthsFlag)(&c.NaturalLengths), "lengths", "natural answer lengths in tokens, comma-separated: each answer stops by itself (finish_reason stop) at a length drawn between them, unless max_tokens is smaller (default: the reference run's 274,281,321,433,455,519)")
	fs.BoolVar(&c.ExactLength, "exact-length", false, "generate exactly max_tokens (finish_reason length), or --default-max-tokens without a limit, instead of natural stops")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", 256, "completion tokens when a request sets no max_tokens, with --exact-length")
	fs.Float64Var(&c.ReasoningShare, "reasoning-share", 0.5, "share of completion tokens that are reasoning, sent before content")
	fs.TextVar(&c.Timings, "timings", sim.TimingAuto, "engine timing in the final chunk: none, vllm (metrics.queue_time_ms …), llamacpp (timings.prompt_ms …) or auto (the engine's)")
	fs.TextVar(&c.Head, "head", sim.HeadAuto, "when a stream's response head leaves: admission (vLLM), slot-start (llama.cpp), first-output (ollama) or auto (the engine's)")
	fs.BoolVar(&c.TGIHeaders, "tgi-headers", false, "add TGI's x-queue-time, x-inference-time … headers to non-stream responses")
	fs.Float64Var(&c.FailRate, "fail-rate", 0, "share of requests answered with 500, 0 to 1")
	fs.Float64Var(&c.TruncateRate, "truncate-rate", 0, "share of streams that end early but cleanly, as ollama's do (HTTP 200, no finish_reason, no usage, no [DONE]), 0 to 1")
	fs.Int64Var(&c.Seed, "seed", 1, "seed for event sizes, filler text, answer lengths, failures and truncations")
	fs.DurationVar(&c.KeepAliveTimeout, "keepalive-timeout", sim.DefaultKeepAliveTimeout, "close a keep-alive connection idle this long, as uvicorn (vLLM, SGLang) does after 5s; 0: never, as Go engines such as ollama")
	reportCached := fs.Bool("report-cached", true, "report cached prompt tokens in usage, as vLLM does; false: report none while the prefix cache still cuts prefill, as ollama and many llama.cpp servers do")
	if err := parseFlags(fs, args); err != nil {
		return c, "", err
	}
	c.UnreportedCache = !*reportCached
	if c.KeepAliveTimeout == 0 {
		c.KeepAliveTimeout = -1 // the flag's 0 is "never"; the Config's 0 is the default
	}
	return c, listen, nil
}

// lengthsFlag is a comma-separated list of token counts.
type lengthsFlag []int

func (f *lengthsFlag) String() string {
	if f == nil {
		return ""
	}
	parts := make([]string, len(*f))
	for i, n := range *f {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (f *lengthsFlag) Set(v string) error {
	var out []int
	for _, p := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			return fmt.Errorf("want token counts >= 1, got %q", p)
		}
		out = append(out, n)
	}
	*f = out
	return nil
}
