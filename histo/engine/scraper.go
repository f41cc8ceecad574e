package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"
)

// Defaults of a Scraper.
const (
	DefaultInterval = time.Second
	DefaultTimeout  = 2 * time.Second
	DefaultMaxBytes = 4 << 20 // vLLM's page with many histograms is ~100 KB
	// absentEvery is how often an engine that answered 404 is asked again:
	// it may be restarted with metrics on (llama-server --metrics).
	absentEvery = time.Minute
	// ringSize samples are kept: at 1 s, 17 minutes, longer than a request.
	ringSize = 1024
)

// Config configures a Scraper.
type Config struct {
	URL      string        // the engine's /metrics
	Interval time.Duration // between scrapes; DefaultInterval if 0
	Timeout  time.Duration // one scrape, whole; DefaultTimeout if 0
	MaxBytes int64         // a larger page is an error; DefaultMaxBytes if 0
	Client   *http.Client  // nil: a client of its own, no proxy from the environment
	// Logf reports changes of state only (the first success, a 404, an
	// error after a success), so that an engine without /metrics costs one
	// line. It must not block. nil logs nothing.
	Logf func(format string, args ...any)
	// Totals, if set, is called right after each successful scrape: the
	// proxy's own totals at the same moment, for the agreement check.
	Totals func() Totals
}

// Totals are the proxy's own cumulative counts, to hold against the
// engine's: prompt and output tokens from usage, and the split's prefill
// seconds, for successful inference requests; and the inference requests
// it recorded, of which Unaccounted reached the engine but have no prompt
// tokens in PromptTokens (failed, or streamed without a usage chunk),
// though the engine may have counted theirs.
type Totals struct {
	PromptTokens, OutputTokens, PrefillSecs float64
	Requests, Unaccounted                   float64
}

// Sample is one scrape: when, what the engine said, and the proxy's
// totals at that moment.
type Sample struct {
	At    time.Time // midway between sending the scrape and reading its head
	Read  Reading
	Proxy Totals
}

// State is the scraper's standing with the engine.
type State uint8

// States of a Scraper.
const (
	StateStarting State = iota // nothing scraped yet
	StateOK                    // the last scrape succeeded
	StateAbsent                // the engine has no /metrics: 404 (ollama) or 501 (llama-server without --metrics)
	StateFailing               // the last scrape failed otherwise
)

var stateNames = [...]string{"starting", "ok", "absent", "failing"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// Scraper polls one /metrics URL on its own goroutine (Run) and keeps the
// last ringSize samples. Its methods are safe for concurrent use; readers
// take a read lock and never wait on the network.
type Scraper struct {
	cfg Config

	mu    sync.RWMutex
	ring  [ringSize]Sample
	n     int // samples in ring
	next  int // where the next sample goes
	state State
	errs  int64 // failed scrapes
	last  error
}

// New returns a Scraper for cfg; Run starts it.
func New(cfg Config) *Scraper {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{MaxIdleConns: 1, IdleConnTimeout: 30 * time.Second}}
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	return &Scraper{cfg: cfg}
}

// Run scrapes until ctx ends. After a 404 or 501 it asks again only every
// absentEvery; after another failure it backs off, doubling up to 30 s.
func (s *Scraper) Run(ctx context.Context) {
	wait := time.Duration(0)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.Scrape(ctx)
		switch {
		case err == nil:
			wait = s.cfg.Interval
		case errors.Is(err, errAbsent):
			wait = absentEvery
		default:
			wait = min(max(2*wait, s.cfg.Interval), 30*time.Second)
		}
		t.Reset(wait)
	}
}

var errAbsent = errors.New("engine: no /metrics")

// Scrape reads the engine once and records the sample. It is what Run
// calls; tests call it directly.
func (s *Scraper) Scrape(parent context.Context) error {
	ctx, cancel := context.WithTimeout(parent, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.URL, nil)
	if err != nil {
		return s.fail(err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	sent := time.Now()
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		if parent.Err() != nil {
			return parent.Err() // stopping: not the engine's failure, nothing to say
		}
		return s.fail(err)
	}
	at := sent.Add(time.Since(sent) / 2)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusNotImplemented {
		// ollama has no /metrics (404); llama-server without --metrics
		// answers 501 not_supported_error.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return s.fail(fmt.Errorf("%w: %d", errAbsent, resp.StatusCode))
	}
	if resp.StatusCode != http.StatusOK {
		return s.fail(fmt.Errorf("engine: /metrics answered %d", resp.StatusCode))
	}
	body := io.LimitReader(resp.Body, s.cfg.MaxBytes+1)
	lr := &countingReader{r: body}
	r, err := Parse(lr)
	if lr.n > s.cfg.MaxBytes {
		return s.fail(fmt.Errorf("engine: /metrics larger than %d bytes", s.cfg.MaxBytes))
	}
	if err != nil {
		return s.fail(fmt.Errorf("engine: /metrics: %w", err))
	}
	smp := Sample{At: at, Read: r}
	if s.cfg.Totals != nil {
		smp.Proxy = s.cfg.Totals()
	}
	s.add(smp)
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (s *Scraper) add(smp Sample) {
	s.mu.Lock()
	s.ring[s.next] = smp
	s.next = (s.next + 1) % ringSize
	s.n = min(s.n+1, ringSize)
	was := s.state
	s.state, s.last = StateOK, nil
	s.mu.Unlock()
	if was != StateOK {
		s.cfg.Logf("engine metrics: scraping %s (%s)", s.cfg.URL, smp.Read.Kind)
	}
}

func (s *Scraper) fail(err error) error {
	st := StateFailing
	if errors.Is(err, errAbsent) {
		st = StateAbsent
	}
	s.mu.Lock()
	was := s.state
	s.state, s.last = st, err
	s.errs++
	s.mu.Unlock()
	if was != st {
		if st == StateAbsent {
			s.cfg.Logf("engine metrics: %s exports none (%v: ollama has none, llama-server needs --metrics); asking again every %s", s.cfg.URL, err, absentEvery)
		} else {
			s.cfg.Logf("engine metrics: scraping %s failed: %v", s.cfg.URL, err)
		}
	}
	return err
}

// Status is the scraper's state, the number of failed scrapes and the
// last error.
func (s *Scraper) Status() (State, int64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.state, s.errs, s.last
}

// Last returns the newest sample, if any.
func (s *Scraper) Last() (Sample, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.n == 0 {
		return Sample{}, false
	}
	return s.ring[(s.next-1+ringSize)%ringSize], true
}

// at returns the i-th oldest sample; the caller holds the lock.
func (s *Scraper) at(i int) *Sample {
	return &s.ring[(s.next-s.n+i+ringSize)%ringSize]
}

// LoadAt returns the engine's running and waiting counts as last scraped
// at or before t (histo.EngineLoad). ok is false when no sample is that
// old, when the sample is older than three intervals before t (a stale
// reading stands for nothing), or when the engine exports no counts.
func (s *Scraper) LoadAt(t time.Time) (running, waiting int, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i := sort.Search(s.n, func(i int) bool { return s.at(i).At.After(t) }) - 1
	if i < 0 {
		return 0, 0, false
	}
	smp := s.at(i)
	if t.Sub(smp.At) > 3*s.cfg.Interval || math.IsNaN(smp.Read.Running) || math.IsNaN(smp.Read.Waiting) {
		return 0, 0, false
	}
	return int(smp.Read.Running), int(smp.Read.Waiting), true
}

// Agreement is the engine's totals against the proxy's over the same
// interval, from the oldest kept sample to the newest. A ratio is engine
// ÷ proxy: 1 when the proxy saw all the engine's work and counted it the
// same; above 1 when others share the engine (more front doors, other
// clients); NaN when either side has nothing in the interval or the engine
// does not export it.
type Agreement struct {
	Kind          Kind
	Seconds       float64 // the interval's length
	EnginePrompt  float64 // prompt tokens, cache hits included
	ProxyPrompt   float64
	PromptRatio   float64
	EngineOutput  float64
	ProxyOutput   float64
	OutputRatio   float64
	EnginePrefill float64 // seconds
	ProxyPrefill  float64
	PrefillRatio  float64
	// UnaccountedShare is the share of the proxy's requests over the
	// interval whose prompt tokens it does not know (Totals.Unaccounted):
	// a PromptRatio above 1 says others share the engine only when it is
	// small. NaN without requests.
	UnaccountedShare float64
}

// Agreement compares the totals over the kept samples.
func (s *Scraper) Agreement() (Agreement, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.n < 2 {
		return Agreement{}, false
	}
	a, b := s.at(0), s.at(s.n-1)
	g := Agreement{
		Kind:          b.Read.Kind,
		Seconds:       b.At.Sub(a.At).Seconds(),
		EnginePrompt:  b.Read.PromptTokens - a.Read.PromptTokens,
		ProxyPrompt:   b.Proxy.PromptTokens - a.Proxy.PromptTokens,
		EngineOutput:  b.Read.OutputTokens - a.Read.OutputTokens,
		ProxyOutput:   b.Proxy.OutputTokens - a.Proxy.OutputTokens,
		EnginePrefill: b.Read.PrefillSecs - a.Read.PrefillSecs,
		ProxyPrefill:  b.Proxy.PrefillSecs - a.Proxy.PrefillSecs,
	}
	g.PromptRatio = ratio(g.EnginePrompt, g.ProxyPrompt)
	g.OutputRatio = ratio(g.EngineOutput, g.ProxyOutput)
	g.PrefillRatio = ratio(g.EnginePrefill, g.ProxyPrefill)
	g.UnaccountedShare = ratio(b.Proxy.Unaccounted-a.Proxy.Unaccounted, b.Proxy.Requests-a.Proxy.Requests)
	return g, true
}

func ratio(engine, proxy float64) float64 {
	if math.IsNaN(engine) || math.IsNaN(proxy) || proxy <= 0 || engine < 0 {
		return math.NaN() // a counter that went back: the engine restarted
	}
	return engine / proxy
}

// SampleBefore returns the latest sample taken before t: the history the
// split reads back over a request's wait (histo's loadHistory). ok is
// false when none was kept.
func (s *Scraper) SampleBefore(t time.Time) (Sample, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i := sort.Search(s.n, func(i int) bool { return !s.at(i).At.Before(t) }) - 1
	if i < 0 {
		return Sample{}, false
	}
	return *s.at(i), true
}
