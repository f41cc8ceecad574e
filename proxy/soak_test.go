package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// soakDuration is 20 s in CI; ANVIL_SOAK=10m (any Go duration) runs longer.
func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("ANVIL_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "ANVIL_SOAK")
		return d
	}
	if testing.Short() {
		return 5 * time.Second
	}
	return 20 * time.Second
}

// outcomeCounter is a Recorder that counts Traces by outcome; it keeps
// none, so it can take any number.
type outcomeCounter struct {
	NopRecorder
	kinds [len(errKindNames)]atomic.Int64
}

func (c *outcomeCounter) Record(t *Trace) { c.kinds[t.ErrKind].Add(1) }

func (c *outcomeCounter) total() int64 {
	var n int64
	for i := range c.kinds {
		n += c.kinds[i].Load()
	}
	return n
}

// soakUpstream streams seeded SSE: events=n, gap=ms, die=k (abort after k
// events); stream=0 answers one JSON body instead.
func soakUpstream(t *testing.T) string {
	t.Helper()
	return startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		q := r.URL.Query()
		seed, _ := strconv.ParseUint(q.Get("seed"), 10, 64)
		n, _ := strconv.Atoi(q.Get("events"))
		if q.Get("stream") == "0" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, soakJSON(seed))
			return
		}
		gap, _ := strconv.Atoi(q.Get("gap"))
		die, _ := strconv.Atoi(q.Get("die"))
		sseHeaders(w)
		rng := rand.New(rand.NewPCG(seed, 1))
		for i := 0; i < n; i++ {
			if die > 0 && i == die {
				panic(http.ErrAbortHandler)
			}
			io.WriteString(w, soakEvent(rng))
			w.(http.Flusher).Flush()
			time.Sleep(time.Duration(gap) * time.Millisecond)
		}
		io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":`+strconv.Itoa(n)+"}}\n\ndata: [DONE]\n\n")
	}).URL
}

func soakEvent(rng *rand.Rand) string {
	return `data: {"choices":[{"delta":{"content":"` + strings.Repeat("ab ", 1+rng.IntN(100)) + "\"}}]}\n\n"
}

func soakJSON(seed uint64) string {
	return `{"choices":[{"message":{"content":"seed ` + strconv.FormatUint(seed, 10) + `"}}],"usage":{"prompt_tokens":9,"completion_tokens":2}}`
}

// soakBody is what soakUpstream sends for a whole stream.
func soakBody(seed uint64, n int) string {
	var b strings.Builder
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < n; i++ {
		b.WriteString(soakEvent(rng))
	}
	b.WriteString(`data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":` + strconv.Itoa(n) + "}}\n\ndata: [DONE]\n\n")
	return b.String()
}

// soakSample is the process state at one moment.
type soakSample struct {
	goroutines int
	heap       uint64 // live heap right after a GC
	fds        int
}

func sampleNow() soakSample {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	fds, _ := os.ReadDir("/proc/self/fd")
	return soakSample{goroutines: runtime.NumGoroutine(), heap: m.HeapAlloc, fds: len(fds)}
}

// TestSoak (Q6) runs mixed traffic (80% streams, 10% client aborts, 5%
// upstream deaths, 5% non-stream) for soakDuration: after warm-up the
// goroutine count, live heap and open files hold steady, every completed
// stream is byte-identical to what the upstream sent, every failure is the
// injected one, and the proxy ends up holding nothing.
func TestSoak(t *testing.T) {
	dur := soakDuration(t)
	up := soakUpstream(t)
	rec := &outcomeCounter{}
	// Small tracker caps, so that the trackers reach their steady size
	// during warm-up and any later growth is a leak.
	base, p := startProxy(t, Config{Upstream: up, PrefixMaxBytes: 1 << 20, RetryMaxBytes: 1 << 20}, rec)
	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}

	const workers = 16
	var (
		stop                         atomic.Bool
		sent, complete, aborted, cut atomic.Int64
		altered                      atomic.Int64
		mu                           sync.Mutex
		failures                     []string
		wg                           sync.WaitGroup
		seeds                        atomic.Uint64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 10 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	worker := func(id uint64) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(id, 7))
		for !stop.Load() {
			seed := seeds.Add(1)
			n := 3 + rng.IntN(20)
			kind := rng.IntN(100)
			prompt := `{"model":"m","stream":true,"messages":[{"role":"user","content":"task ` + strconv.Itoa(int(seed%50)) + strings.Repeat(" context", rng.IntN(400)) + `"}]}`
			gap := rng.IntN(4)
			if kind < 10 {
				gap = 30 // slow enough to leave mid-stream
			}
			url := fmt.Sprintf("%s/v1/chat/completions?seed=%d&events=%d&gap=%d", base, seed, n, gap)
			switch {
			case kind < 10:
			case kind < 15:
				url += "&die=" + strconv.Itoa(1+rng.IntN(n-1))
			case kind < 20:
				url += "&stream=0"
			}
			sent.Add(1)
			resp, err := client.Post(url, "application/json", strings.NewReader(prompt))
			if err != nil {
				fail("request %d: %v", seed, err)
				continue
			}
			if kind < 10 { // the client gives up after the first bytes
				buf := make([]byte, 64)
				_, err := io.ReadFull(resp.Body, buf)
				resp.Body.Close()
				if err != nil {
					fail("abort %d: %v", seed, err)
				}
				aborted.Add(1)
				continue
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := soakBody(seed, n)
			if kind >= 15 && kind < 20 {
				want = soakJSON(seed)
			}
			switch {
			case kind < 15 && errors.Is(err, io.ErrUnexpectedEOF) && strings.HasPrefix(want, string(got)):
				cut.Add(1)
			case err != nil || resp.StatusCode != 200:
				fail("request %d (kind %d): status %d, %v", seed, kind, resp.StatusCode, err)
			case !bytes.Equal(got, []byte(want)):
				altered.Add(1)
				fail("request %d: %d bytes altered", seed, len(got))
			default:
				complete.Add(1)
			}
		}
	}

	before := sampleNow()
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go worker(uint64(i))
	}
	var samples []soakSample
	began := time.Now()
	tick := time.NewTicker(max(dur/20, 500*time.Millisecond))
	for time.Since(began) < dur {
		<-tick.C
		samples = append(samples, sampleNow())
	}
	tick.Stop()
	stop.Store(true)
	wg.Wait()
	took := time.Since(began)
	requireDrained(t, p, transport)
	after := sampleNow()

	steady := samples[len(samples)/4:] // after warm-up
	third := len(steady) / 3
	mean := func(s []soakSample, f func(soakSample) float64) float64 {
		var sum float64
		for _, x := range s {
			sum += f(x)
		}
		return sum / float64(len(s))
	}
	heap := func(s soakSample) float64 { return float64(s.heap) }
	gor := func(s soakSample) float64 { return float64(s.goroutines) }
	fds := func(s soakSample) float64 { return float64(s.fds) }
	early, late := steady[:third], steady[len(steady)-third:]
	t.Logf("soak %v: %d requests (%.0f/s): %d complete, %d cut by the upstream, %d client aborts; outcomes none=%d upstream_broken=%d client_gone=%d",
		took.Round(time.Second), sent.Load(), float64(sent.Load())/took.Seconds(), complete.Load(), cut.Load(), aborted.Load(),
		rec.kinds[ErrNone].Load(), rec.kinds[ErrUpstreamBroken].Load(), rec.kinds[ErrClientGone].Load())
	t.Logf("upstream dials %d (%.3f per request)", p.Stats().UpstreamDials.Load(), float64(p.Stats().UpstreamDials.Load())/float64(max(sent.Load(), 1)))
	t.Logf("steady state: goroutines %.0f → %.0f, live heap %.1f → %.1f MiB, fds %.0f → %.0f; before %d goroutines %.1f MiB, after %d goroutines %.1f MiB",
		mean(early, gor), mean(late, gor), mean(early, heap)/(1<<20), mean(late, heap)/(1<<20), mean(early, fds), mean(late, fds),
		before.goroutines, float64(before.heap)/(1<<20), after.goroutines, float64(after.heap)/(1<<20))

	require.Empty(t, failures)
	require.Zero(t, altered.Load(), "bytes altered on completed streams")
	require.Positive(t, complete.Load())
	require.Positive(t, cut.Load())
	require.Positive(t, aborted.Load())
	require.Eventually(t, func() bool { return rec.total() == sent.Load() }, 5*time.Second, 10*time.Millisecond, "one trace per request")
	require.Equal(t, cut.Load(), rec.kinds[ErrUpstreamBroken].Load())
	require.Equal(t, aborted.Load(), rec.kinds[ErrClientGone].Load())
	require.Equal(t, sent.Load(), rec.kinds[ErrNone].Load()+rec.kinds[ErrUpstreamBroken].Load()+rec.kinds[ErrClientGone].Load(),
		"an outcome nobody injected")
	require.LessOrEqual(t, mean(late, gor), mean(early, gor)*1.1+20, "goroutines grow")
	require.LessOrEqual(t, mean(late, heap), mean(early, heap)*1.25+float64(4<<20), "live heap grows")
	require.LessOrEqual(t, mean(late, fds), mean(early, fds)+float64(2*workers), "open files grow")
}
