package engine

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func readFixture(t *testing.T, name string) Reading {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	require.NoError(t, err)
	defer f.Close()
	r, err := Parse(f)
	require.NoError(t, err)
	return r
}

// TestParse: each engine's page, in the shape its server writes, read into
// the same fields.
func TestParse(t *testing.T) {
	nan := math.NaN()
	for _, tt := range []struct {
		file string
		want Reading
	}{
		// Two engine cores: their counts add up; the newer KV-cache name wins.
		{"vllm.prom", Reading{Kind: KindVLLM, Running: 4, Waiting: 2, KVCacheUsage: 0.4125, KVCapacity: 2 * 16 * 2048, CacheHitRate: nan,
			PromptTokens: 50000, CachedTokens: 250, CacheQueries: 1000, OutputTokens: 12000,
			PrefillSecs: 0.75, QueueSecs: 1.5, QueueRequests: 10}},
		// prompt_tokens_total leaves out cache hits: added back.
		{"llamacpp.prom", Reading{Kind: KindLlamaCpp, Running: 2, Waiting: 3, KVCacheUsage: nan, KVCapacity: nan, CacheHitRate: nan,
			PromptTokens: 6886 + 678, CachedTokens: 678, CacheQueries: nan, OutputTokens: 3469,
			PrefillSecs: 29.03, QueueSecs: nan, QueueRequests: nan}},
		{"sglang.prom", Reading{Kind: KindSGLang, Running: 5, Waiting: 7, KVCacheUsage: 0.28, KVCapacity: nan, CacheHitRate: 0.007507552643049313,
			PromptTokens: 8.128902e+06, CachedTokens: nan, CacheQueries: nan, OutputTokens: 7.557572e+06,
			PrefillSecs: nan, QueueSecs: nan, QueueRequests: nan}},
		{"tgi.prom", Reading{Kind: KindTGI, Running: 4, Waiting: 7, KVCacheUsage: nan, KVCapacity: nan, CacheHitRate: nan,
			PromptTokens: 20480, CachedTokens: nan, CacheQueries: nan, OutputTokens: 8123,
			PrefillSecs: nan, QueueSecs: 3.25, QueueRequests: 44}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			got := readFixture(t, tt.file)
			// NaN != NaN: compare the printed values.
			require.Equal(t, fmt.Sprintf("%+v", tt.want), fmt.Sprintf("%+v", got))
		})
	}
	r, err := Parse(strings.NewReader("# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 7\n"))
	require.NoError(t, err)
	require.Equal(t, KindUnknown, r.Kind)
	require.True(t, math.IsNaN(r.Running))
	// The cache's size: kv_cache_size_tokens where vLLM prints it, else
	// blocks × block size; "None" before the cache is allocated.
	for page, want := range map[string]float64{
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="661",kv_cache_size_tokens="10576"} 1`: 10576,
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="661"} 1`:                              16 * 661,
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1`:                             math.NaN(),
	} {
		r, err := Parse(strings.NewReader(page + "\n"))
		require.NoError(t, err, page)
		require.Equal(t, fmt.Sprint(want), fmt.Sprint(r.KVCapacity), page)
	}
	_, err = Parse(strings.NewReader("not a { metric page"))
	require.Error(t, err)
}

// enginePage serves a llama.cpp-style /metrics page whose counts the test sets.
type enginePage struct {
	running, waiting, prompt atomic.Int64
	status                   atomic.Int64 // 0 = 200
	hits                     atomic.Int64
}

func (e *enginePage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.hits.Add(1)
	if s := e.status.Load(); s != 0 {
		w.WriteHeader(int(s))
		return
	}
	fmt.Fprintf(w, "llamacpp:requests_processing %d\nllamacpp:requests_deferred %d\nllamacpp:prompt_tokens_total %d\nllamacpp:tokens_predicted_total 0\nllamacpp:prompt_seconds_total 1.5\n",
		e.running.Load(), e.waiting.Load(), e.prompt.Load())
}

type logs struct {
	mu    sync.Mutex
	lines []string
}

func (l *logs) logf(format string, args ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *logs) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// TestLoadAt: the counts as last scraped at or before t, none before the
// first scrape, none from a stale scrape.
func TestLoadAt(t *testing.T) {
	page := &enginePage{}
	srv := httptest.NewServer(page)
	defer srv.Close()
	s := New(Config{URL: srv.URL, Interval: time.Second})
	before := time.Now()
	_, _, ok := s.LoadAt(before)
	require.False(t, ok, "nothing scraped")

	page.running.Store(1)
	page.waiting.Store(2)
	require.NoError(t, s.Scrape(context.Background()))
	first, _ := s.Last()
	page.running.Store(2)
	page.waiting.Store(5)
	require.NoError(t, s.Scrape(context.Background()))
	second, _ := s.Last()
	require.True(t, second.At.After(first.At))

	_, _, ok = s.LoadAt(first.At.Add(-time.Nanosecond))
	require.False(t, ok, "before the first sample")
	r, w, ok := s.LoadAt(first.At)
	require.True(t, ok)
	require.Equal(t, [2]int{1, 2}, [2]int{r, w})
	r, w, ok = s.LoadAt(second.At.Add(time.Millisecond))
	require.True(t, ok)
	require.Equal(t, [2]int{2, 5}, [2]int{r, w})
	_, _, ok = s.LoadAt(second.At.Add(4 * time.Second))
	require.False(t, ok, "three intervals old: stale")
}

// TestRingWraps: past ringSize samples the oldest go, and LoadAt still
// finds the newest by time.
func TestRingWraps(t *testing.T) {
	s := New(Config{URL: "http://127.0.0.1:1", Interval: time.Second})
	t0 := time.Now()
	for i := range ringSize + 10 {
		s.add(Sample{At: t0.Add(time.Duration(i) * time.Millisecond), Read: Reading{Running: float64(i), Waiting: 0}})
	}
	r, _, ok := s.LoadAt(t0.Add(time.Duration(ringSize+5) * time.Millisecond))
	require.True(t, ok)
	require.Equal(t, ringSize+5, r)
	_, _, ok = s.LoadAt(t0.Add(5 * time.Millisecond))
	require.False(t, ok, "evicted")
}

// TestAbsentLoggedOnceAndBacksOff: an engine without /metrics (ollama
// answers 404, llama-server without --metrics 501) is said once, and Run
// then asks only every absentEvery.
func TestAbsentLoggedOnceAndBacksOff(t *testing.T) {
	for _, code := range []int{http.StatusNotFound, http.StatusNotImplemented} {
		t.Run(fmt.Sprint(code), func(t *testing.T) { testAbsent(t, code) })
	}
}

func testAbsent(t *testing.T, code int) {
	page := &enginePage{}
	page.status.Store(int64(code))
	srv := httptest.NewServer(page)
	defer srv.Close()
	var l logs
	s := New(Config{URL: srv.URL, Interval: 5 * time.Millisecond, Logf: l.logf})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	require.Eventually(t, func() bool { st, _, _ := s.Status(); return st == StateAbsent }, 5*time.Second, time.Millisecond)
	// At a 5 ms interval, 200 ms would be 40 scrapes; backed off, it is one.
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	require.EqualValues(t, 1, page.hits.Load())
	require.Len(t, l.all(), 1)
	require.Contains(t, l.all()[0], fmt.Sprint(code))
	_, _, ok := s.LoadAt(time.Now())
	require.False(t, ok)
}

// TestBounded: a page over MaxBytes is refused, and an engine that does not
// answer costs at most the timeout.
func TestBounded(t *testing.T) {
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for range 2000 {
			fmt.Fprintln(w, "llamacpp:requests_processing 1")
		}
	}))
	defer big.Close()
	s := New(Config{URL: big.URL, MaxBytes: 1000})
	err := s.Scrape(context.Background())
	require.ErrorContains(t, err, "larger than 1000 bytes")
	_, ok := s.Last()
	require.False(t, ok)

	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hang.Close()
	defer close(release)
	s = New(Config{URL: hang.URL, Timeout: 50 * time.Millisecond})
	start := time.Now()
	require.Error(t, s.Scrape(context.Background()))
	require.Less(t, time.Since(start), 5*time.Second)
	st, n, _ := s.Status()
	require.Equal(t, StateFailing, st)
	require.EqualValues(t, 1, n)
}

// TestAgreement: engine and proxy totals over the same interval. When the
// proxy saw half the engine's prompt tokens (another front door sent the
// rest), the ratio says 2.
func TestAgreement(t *testing.T) {
	page := &enginePage{}
	srv := httptest.NewServer(page)
	defer srv.Close()
	var proxyPrompt, requests, unaccounted atomic.Int64
	s := New(Config{URL: srv.URL, Totals: func() Totals {
		return Totals{PromptTokens: float64(proxyPrompt.Load()), Requests: float64(requests.Load()), Unaccounted: float64(unaccounted.Load())}
	}})
	_, ok := s.Agreement()
	require.False(t, ok)
	page.prompt.Store(100)
	proxyPrompt.Store(40)
	requests.Store(7)
	unaccounted.Store(5) // before the interval: not counted
	require.NoError(t, s.Scrape(context.Background()))
	page.prompt.Store(300)
	proxyPrompt.Store(140)
	requests.Store(27)
	unaccounted.Store(6)
	require.NoError(t, s.Scrape(context.Background()))
	g, ok := s.Agreement()
	require.True(t, ok)
	require.Equal(t, KindLlamaCpp, g.Kind)
	require.InDelta(t, 200, g.EnginePrompt, 1e-9)
	require.InDelta(t, 100, g.ProxyPrompt, 1e-9)
	require.InDelta(t, 2, g.PromptRatio, 1e-9)
	require.InDelta(t, 0.05, g.UnaccountedShare, 1e-9, "1 of the interval's 20 requests")
	require.True(t, math.IsNaN(g.OutputRatio), "no output on either side: no ratio")
	require.True(t, math.IsNaN(g.PrefillRatio))
}

// TestStopIsNotAFailure: a scrape cut because the scraper is stopping is
// not logged or counted as the engine's failure.
func TestStopIsNotAFailure(t *testing.T) {
	started := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
	}))
	defer hang.Close()
	var l logs
	s := New(Config{URL: hang.URL, Logf: l.logf})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	<-started
	cancel()
	<-done
	st, n, _ := s.Status()
	require.Equal(t, StateStarting, st)
	require.Zero(t, n)
	require.Empty(t, l.all())
}
