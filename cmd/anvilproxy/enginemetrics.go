package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/engine"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// engineFlags are --engine-metrics and --engine-metrics-interval.
type engineFlags struct {
	url      string // "" = the upstream's /metrics; "off" = none
	interval time.Duration
}

func (f *engineFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "engine-metrics", "", `the engine's Prometheus /metrics, scraped for its own running/waiting counts (evidence for the queue/prefill split that holds behind several proxies), per-request engine queue depth and an engine-vs-proxy agreement check; default: the upstream's /metrics; "off" disables it (docs/engines.md)`)
	fs.DurationVar(&f.interval, "engine-metrics-interval", engine.DefaultInterval, "how often --engine-metrics is scraped")
}

// engineMetricsURL is where the engine's /metrics is: flag's URL, or the
// upstream's root (or path prefix, without a trailing /v1) + /metrics; ""
// when off.
func engineMetricsURL(flag, upstream string) (string, error) {
	switch flag {
	case "off":
		return "", nil
	case "":
		up, err := proxy.ParseUpstream(upstream)
		if err != nil {
			return "", err
		}
		scheme := "http"
		if up.TLS {
			scheme = "https"
		}
		return scheme + "://" + up.Host + strings.TrimSuffix(up.Prefix, "/v1") + "/metrics", nil
	}
	u, err := url.Parse(flag)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--engine-metrics %q: want an http(s) URL or \"off\"", flag)
	}
	return flag, nil
}

// startEngineScraper starts scraping the engine's /metrics on its own
// goroutine, hands its counts to the Recorder as the split's evidence and
// registers the anvilproxy_engine_* gauges. It returns the scraper (nil
// when off) and its stop.
func startEngineScraper(f engineFlags, upstream string, rec *histo.Recorder, reg prometheus.Registerer, log *zap.Logger) (*engine.Scraper, func(), error) {
	u, err := engineMetricsURL(f.url, upstream)
	if err != nil || u == "" {
		return nil, func() {}, err
	}
	s := engine.New(engine.Config{
		URL:      u,
		Interval: f.interval,
		Totals:   rec.EngineTotals,
		Logf: func(format string, args ...any) {
			log.Info(redactedMsg(fmt.Sprintf(format, args...), u))
		},
	})
	rec.SetEngineLoad(s)
	registerEngineMetrics(reg, s)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	return s, func() { cancel(); <-done }, nil
}

// redactedMsg keeps a URL's credentials (an --engine-metrics URL may
// carry some) out of a log line.
func redactedMsg(msg, u string) string { return strings.ReplaceAll(msg, u, redacted(u)) }

// registerEngineMetrics exports what the scraper read: the engine's own
// counts, and the agreement of its totals with the proxy's. NaN where the
// engine exports nothing.
func registerEngineMetrics(reg prometheus.Registerer, s *engine.Scraper) {
	last := func(get func(engine.Reading) float64) func() float64 {
		return func() float64 {
			smp, ok := s.Last()
			if !ok {
				return math.NaN()
			}
			return get(smp.Read)
		}
	}
	agree := func(get func(engine.Agreement) float64) func() float64 {
		return func() float64 {
			g, ok := s.Agreement()
			if !ok {
				return math.NaN()
			}
			return get(g)
		}
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(
		gauge("anvilproxy_engine_metrics_up", "1 when the last scrape of the engine's /metrics succeeded, 0 otherwise (ollama has none; llama-server needs --metrics).",
			func() float64 {
				if st, _, _ := s.Status(); st == engine.StateOK {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "anvilproxy_engine_metrics_scrape_failures_total", Help: "Failed scrapes of the engine's /metrics."},
			func() float64 { _, n, _ := s.Status(); return float64(n) }),
		gauge("anvilproxy_engine_requests_running", "Requests the engine is computing, from its /metrics (vLLM num_requests_running, llama.cpp requests_processing, SGLang num_running_reqs, TGI batch_current_size); all its traffic, not only this proxy's.",
			last(func(r engine.Reading) float64 { return r.Running })),
		gauge("anvilproxy_engine_requests_waiting", "Requests queued in the engine, from its /metrics (vLLM num_requests_waiting, llama.cpp requests_deferred, SGLang num_queue_reqs, TGI queue_size).",
			last(func(r engine.Reading) float64 { return r.Waiting })),
		gauge("anvilproxy_engine_kv_cache_usage_ratio", "Fraction of the engine's KV cache in use, from its /metrics.",
			last(func(r engine.Reading) float64 { return r.KVCacheUsage })),
		gauge("anvilproxy_engine_prompt_tokens_ratio", "Engine ÷ proxy prompt tokens over the scraper's window: 1 when the proxy sees all the engine's traffic and counts it alike; above 1 when others share the engine.",
			agree(func(g engine.Agreement) float64 { return g.PromptRatio })),
		gauge("anvilproxy_engine_output_tokens_ratio", "Engine ÷ proxy output tokens over the scraper's window.",
			agree(func(g engine.Agreement) float64 { return g.OutputRatio })),
		gauge("anvilproxy_engine_prefill_seconds_ratio", "Engine ÷ proxy prefill seconds over the scraper's window (the engine's prompt time against the split's prefill).",
			agree(func(g engine.Agreement) float64 { return g.PrefillRatio })),
		gauge("anvilproxy_engine_unaccounted_share", "Share of this proxy's requests over the scraper's window whose prompt tokens it does not know (failed, or streamed without usage): above 0.05 the prompt tokens ratio cannot tell whether others share the engine.",
			agree(func(g engine.Agreement) float64 { return g.UnaccountedShare })),
	)
}
