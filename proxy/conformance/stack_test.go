package conformance

import (
	"encoding/json"
	"flag"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// eventLoop relays the streams on the event loop (Config.EventLoop); its
// default is serve's, and -loop=false runs the suite on the goroutine relay.
var eventLoop = flag.Bool("loop", proxy.DefaultEventLoop, "relay streams on the event loop (serve --event-loop; -loop=false: the goroutine relay)")

// Models created by scripts/real-engine.sh from the same weights.
const (
	plainModel    = "tiny-plain"    // seeded sampling; answers end by themselves
	thinkingModel = "tiny-thinking" // every token arrives as reasoning
	greedyModel   = "tiny-greedy"   // with "temperature":0 repeats one token until ollama cuts the stream
)

// engineURL is the real engine's base URL, or the test skips. The skip is
// loud on purpose: the suite is opt-in, and a silent skip looks like a pass.
func engineURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("ANVIL_REAL_ENGINE")
	if u == "" {
		t.Skip("SKIP real-engine conformance: ANVIL_REAL_ENGINE is not set (run scripts/real-engine.sh test; see docs/real-engine.md)")
	}
	return u
}

// stack is one anvilproxy in front of the engine, wired as serve wires it:
// a histo.Recorder behind proxy.New, the data listener served by
// Proxy.Server and the admin endpoints (/requests) on their own listener.
// Each test gets its own, so records and learned rates never leak between
// tests. Its fields are fixed after newStack; the servers run until the
// test's cleanup.
type stack struct {
	engine   string // the engine's base URL, for direct requests
	proxyURL string
	adminURL string
	rec      *histo.Recorder
	capture  *capture // rec, keeping a copy of every Trace (capture_test.go)
}

// engineWithSlots is the base URL and log file of the server that
// scripts/real-engine.sh started with OLLAMA_NUM_PARALLEL=slots
// (ANVIL_REAL_ENGINE_P<slots>, or ANVIL_REAL_ENGINE for 1), or the test
// skips, loudly.
func engineWithSlots(t *testing.T, slots int) (url, logPath string) {
	t.Helper()
	name := "ANVIL_REAL_ENGINE"
	if slots != 1 {
		name += "_P" + strconv.Itoa(slots)
	}
	url, logPath = os.Getenv(name), os.Getenv(name+"_LOG")
	if url == "" || logPath == "" {
		t.Skipf("SKIP real-engine conformance: %s or %s_LOG is not set (run scripts/real-engine.sh test; see docs/real-engine.md)", name, name)
	}
	return url, logPath
}

// newStack starts a proxy with serve's defaults (no flags) in front of the
// engine.
func newStack(t *testing.T) *stack {
	t.Helper()
	return newStackOn(t, engineURL(t), histo.Config{})
}

// newStackOn starts a proxy in front of the engine at url, its recorder
// configured as serve would configure it from flags (EngineSlots is
// --engine-slots).
func newStackOn(t *testing.T, url string, cfg histo.Config) *stack {
	t.Helper()
	return newStackWith(t, url, cfg, proxy.Config{})
}

// newStackWith is newStackOn with the proxy's own configuration (its
// Upstream is url).
func newStackWith(t *testing.T, url string, cfg histo.Config, pcfg proxy.Config) *stack {
	t.Helper()
	st := &stack{engine: url}
	rec, err := histo.New(cfg, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	st.rec, st.capture = rec, &capture{Recorder: rec}
	pcfg.Upstream = st.engine
	pcfg.EventLoop = pcfg.EventLoop || *eventLoop
	p, err := proxy.New(pcfg, nil, st.capture)
	if err != nil {
		t.Fatal(err)
	}
	st.proxyURL = "http://" + serve(t, func(ln net.Listener) (func(), error) {
		srv := p.Server()
		go srv.Serve(p.Listener(ln)) //nolint:errcheck // ends at Shutdown; through the guarded listener, as serve does (the event loop needs it)
		return func() { _ = srv.Shutdown() }, nil
	})
	st.adminURL = "http://" + serve(t, func(ln net.Listener) (func(), error) {
		hs := &http.Server{Handler: rec.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(ln) //nolint:errcheck // ends at Close
		return func() { hs.Close() }, nil
	})
	return st
}

// serve listens on a loopback port, starts a server on it and stops it at
// the test's cleanup.
func serve(t *testing.T, start func(net.Listener) (func(), error)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop, err := start(ln)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return ln.Addr().String()
}

// record is one /requests record: histo.Request, plus the fields of issue
// 15 that this branch's histo.Request may not have yet (nil when absent).
type record struct {
	histo.Request
	CacheInferredTokens *int64 `json:"cache_inferred_tokens"`
}

// records fetches /requests, newest first.
func (st *stack) records(t *testing.T) []record {
	t.Helper()
	resp, err := http.Get(st.adminURL + "/requests")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Requests []record `json:"requests"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decoding /requests: %v", err)
	}
	return body.Requests
}

// waitRecords polls /requests until it holds n records (the proxy records
// a request just after its last byte reaches the client, so the client can
// be a little ahead) and returns them oldest first.
func (st *stack) waitRecords(t *testing.T, n int) []record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rs := st.records(t)
		if len(rs) >= n {
			out := make([]record, len(rs))
			for i, r := range rs {
				out[len(rs)-1-i] = r
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for the proxy's records: have %d, want %d", len(rs), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
