package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

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
	fmt.Fprintf(stderr, "anvilproxy sim: serving %s on http://%s (slots %d, prefill %.0f tok/s, decode %.0f tok/s)\n",
		c.Model, ln.Addr(), c.Slots, c.PrefillTokensPerSec, c.DecodeTokensPerSec)
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
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
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&listen, "listen", ":8000", "address the simulated engine listens on (host:port)")
	fs.StringVar(&c.Model, "model", sim.DefaultModel, "model name reported in responses")
	fs.IntVar(&c.Slots, "slots", 4, "concurrent sequences; more requests wait in a FIFO queue")
	fs.IntVar(&c.MaxQueue, "max-queue", 64, "requests that may wait for a slot; one more gets 429")
	fs.Float64Var(&c.PrefillTokensPerSec, "prefill-tps", 7700, "prefill rate of uncached prompt tokens, tokens/s")
	fs.Float64Var(&c.DecodeTokensPerSec, "decode-tps", 235, "decode rate per stream, tokens/s")
	fs.IntVar(&c.TokensPerEvent, "tokens-per-event", 5, "mean tokens per SSE event (speculative decoding sends several)")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", 256, "completion tokens when a request sets no max_tokens")
	fs.Float64Var(&c.ReasoningShare, "reasoning-share", 0.5, "share of completion tokens that are reasoning, sent before content")
	fs.TextVar(&c.Timings, "timings", sim.TimingNone, "engine timing in the final chunk: none, vllm (metrics.queue_time_ms …) or llamacpp (timings.prompt_ms …)")
	fs.Float64Var(&c.FailRate, "fail-rate", 0, "share of requests answered with 500, 0 to 1")
	fs.Int64Var(&c.Seed, "seed", 1, "seed for event sizes, filler text and failures")
	reportCached := fs.Bool("report-cached", true, "report cached prompt tokens in usage, as vLLM does; false: report none while the prefix cache still cuts prefill, as ollama and many llama.cpp servers do")
	if err := parseFlags(fs, args); err != nil {
		return c, "", err
	}
	c.UnreportedCache = !*reportCached
	return c, listen, nil
}
