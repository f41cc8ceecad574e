package main

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// TestDemo runs "anvilproxy demo" for a few seconds: it prints where things
// are, a live line, ends by itself, writes a snapshot and reports it.
func TestDemo(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runCmd("demo", "--duration", "4s", "--agents", "4", "--seed", "7",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--snapshot-dir", dir)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	for _, want := range []string{
		"anvilproxy demo: 4 simulated coding agents for 4s",
		"  dashboard  http://127.0.0.1:",
		"  metrics    http://127.0.0.1:",
		"  snapshots  " + dir,
		"p50/p99 ms  queue ",
		"demo finished after ",
		"$ anvilproxy report " + filepath.Join(dir, "anvilproxy-*.json"),
		"model qwen3-8b; protocol anvilproxy-passive-v1",
		"time to first output",
		"ttft <= 3s",
	} {
		require.Contains(t, out, want)
	}
	files, err := snapshotFiles(dir)
	require.NoError(t, err)
	require.NotEmpty(t, files)
	code, report, errOut := runCmd(append([]string{"report"}, files...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, report, "the demo ends with the report of its snapshots")
	// The summary and the report count alike, in the same words.
	sum := regexp.MustCompile(`demo finished after \S+: (\d+) requests, (\d+ failed(?: \([^)]*\))?), (\d+ retr(?:y|ies)); the agents: \d+ turns answered, \d+ ended unfinished and re-sent, \d+ given up`).FindStringSubmatch(out)
	require.NotNil(t, sum, out)
	require.Regexp(t, `^`+sum[1]+` requests: \d+ completed, `+regexp.QuoteMeta(sum[2])+`, `+sum[3]+`; `, report)
}

func TestDemoFlags(t *testing.T) {
	code, _, errOut := runCmd("demo", "--agents", "0")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "must be positive")
	code, _, errOut = runCmd("demo", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, errOut, "-duration duration")
}

func TestLiveTable(t *testing.T) {
	nan := histo.Float(math.NaN())
	ph := func(name string, p50, p99 histo.Float) phaseStats { return phaseStats{Name: name, P50: p50, P99: p99} }
	s := liveStatus{UptimeSec: 75, Requests: 12, Failed: 3, Abandoned: 2, Refused: 1, Retries: 2, Inflight: 5,
		Recent: recentStats{Seconds: 15, Rate: 2.5, CacheHit: 0.873, CacheHitInferred: nan, Phases: []phaseStats{
			ph("queue", 812.4, 2301), ph("prefill", 41.25, 310.9), ph("ttfo", nan, nan), ph("ttft", 1412, 3650), ph("tpot", 4.26, 4.4)}},
		Goodput: nan, Amplification: 1.09, SLOs: "ttft=2s"}
	require.Equal(t, []string{
		"  1:15 / 1:00   since start: 12 requests, 3 failed (2 abandoned, 1 refused), 2 retries   5 in flight",
		"  last 15s         queue   prefill      ttfo      ttft      tpot",
		"  p50 ms             812      41.2         -      1412      4.26",
		"  p99 ms            2301       311         -      3650      4.40",
		"  last 15s     2.5 req/s   cache hit 87.3% of prompt tokens, inferred -",
		"  since start  goodput - (ttft=2s)   retry amplification 1.09x",
	}, s.block("1:15 / 1:00"))
	require.Equal(t, "  1:15  since start: 12 requests, 3 failed (2 abandoned, 1 refused), 2 retries  5 in flight | last 15s p50/p99 ms  queue 812/2301  prefill 41.2/311  ttfo -/-  ttft 1412/3650  tpot 4.26/4.40  cache 87.3% (inferred -) | since start: goodput -  retry 1.09x",
		s.line("1:15"))
	s.Recent.CacheHitInferred = 0.851
	require.Contains(t, s.block("x")[4], "cache hit 87.3% of prompt tokens, inferred 85.1%")
	s.Failed, s.Abandoned, s.Refused, s.Recent.Truncated = 0, 0, 0, true
	require.Contains(t, s.block("x")[0], "12 requests, 0 failed, 2 retries")
	s.Failed, s.Errors, s.Retries, s.Requests = 1, 1, 1, 1
	require.Equal(t, "1 request, 1 failed (1 error), 1 retry", s.countsText(), "plurals (issue 27, 9)")
	require.Contains(t, s.block("x")[1], "newest 512")
	require.Equal(t, 2.0, nearestRank([]float64{3, 1, 2, 4}, 50))
	require.Equal(t, 4.0, nearestRank([]float64{3, 1, 2, 4}, 99))
	require.True(t, math.IsNaN(nearestRank(nil, 50)))
}

// TestDashboardInBrowser loads the dashboard in headless Chromium against
// a running demo and checks that every chart drew data, that the page ran
// without a script error or a Content-Security-Policy violation (the policy
// allows only its own listener), and saves a screenshot. It runs when
// ANVIL_BROWSER_TEST is set, as .ci/run does after installing Debian's
// chromium; ANVIL_SCREENSHOT names the screenshot file.
func TestDashboardInBrowser(t *testing.T) {
	if os.Getenv("ANVIL_BROWSER_TEST") == "" {
		t.Skip("set ANVIL_BROWSER_TEST=1 to load the dashboard in headless Chromium (.ci/run does)")
	}
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("ANVIL_BROWSER_TEST is set but no chromium is installed (apt-get install chromium): dashboard not checked in a browser")
	}
	f := demoFlags{duration: time.Hour, agents: 6, listen: "127.0.0.1:0", adminListen: "127.0.0.1:0",
		snapshotDir: t.TempDir(), interval: time.Hour, seed: 3}
	require.NoError(t, f.slos.Set(demoSLOs))
	d, err := startDemo(&f, zap.NewNop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.finish(io.Discard, io.Discard) })
	// About ten seconds of traffic: enough for every panel to have data.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && (time.Since(d.started) < 10*time.Second || len(d.st.rec.Recent(100)) < 15) {
		time.Sleep(200 * time.Millisecond)
	}
	// A probe that is not inference: listed under the waterfall.
	resp, err := http.Get(d.st.proxyURL + "/v1/models?key=not-shown")
	require.NoError(t, err)
	resp.Body.Close()
	url := d.st.adminURL + "/"

	dom, log := chromium(t, bin, "--dump-dom", url)
	require.Contains(t, dom, `data-ready="true"`, "the page loaded requests and a snapshot; chromium said:\n%s", log)
	for _, id := range []string{"chart-queue", "chart-prefill", "chart-ttfo", "chart-ttft", "chart-tpot", "waterfall", "where", "goodput", "cache"} {
		el := element(dom, id)
		require.Contains(t, el, "<svg", "#%s has a chart", id)
		require.Regexp(t, `<(path|rect|circle)[ >]`, el, "#%s has marks", id)
	}
	// Retries and drifts depend on what the agents did in these seconds:
	// a chart when there were some, the panel's empty state otherwise.
	for _, id := range []string{"retry", "drift"} {
		el := element(dom, id)
		require.True(t, strings.Contains(el, "<svg") || strings.Contains(el, `class="empty"`), "#%s rendered neither a chart nor its empty state", id)
	}
	require.GreaterOrEqual(t, strings.Count(dom, "<svg"), 9)
	require.GreaterOrEqual(t, strings.Count(element(dom, "waterfall"), "<rect"), 15, "the waterfall has bars")
	require.Contains(t, element(dom, "others"), "<td class=\"\">/v1/models</td>")
	require.NotContains(t, dom, "not-shown")
	// One window, said once: the records' span is not shown beside a
	// shorter uptime (issue 27, 5), and the snapshot panels name theirs.
	require.Regexp(t, `id="summary"[^>]*>[^<]*since start \(\d+s\): \d+ requests, \d+ failed, \d+ retr(y|ies) · \d+ in flight`, dom)
	require.NotRegexp(t, `id="summary"[^>]*>[^<]*last \d+s:`, dom)
	require.Regexp(t, `this window \(\d+s so far of 60m\)`, element(dom, "goodput-note"))
	require.Regexp(t, `this window \(\d+s so far of 60m\)`, element(dom, "retry")+element(dom, "drift"))
	// One unit per axis: no chart's ticks mix ms, s and m.
	for _, id := range []string{"chart-queue", "chart-prefill", "chart-ttfo", "chart-ttft", "chart-tpot", "waterfall"} {
		units := map[string]bool{}
		for _, m := range tickUnit.FindAllStringSubmatch(element(dom, id), -1) {
			units[m[1]] = true
		}
		require.LessOrEqual(t, len(units), 1, "#%s ticks in %v", id, units)
	}
	for _, bad := range []string{"Uncaught", "Content Security Policy", "Content-Security-Policy"} {
		require.NotContains(t, log, bad)
	}

	dashboardNeedsToken(t, bin)

	shot := os.Getenv("ANVIL_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(os.TempDir(), "anvilproxy-dashboard.png")
	}
	chromium(t, bin, "--screenshot="+shot, "--window-size=1400,1000", url)
	info, err := os.Stat(shot)
	require.NoError(t, err)
	require.Greater(t, info.Size(), int64(20_000), "a screenshot of a drawn page")
	t.Logf("dashboard screenshot: %s", shot)
}

// dashboardNeedsToken: with --admin-token, the dashboard opened without
// #token= says so in its header and in every panel, instead of "0
// requests" and "no requests yet" (issue 27, 4); with the token it draws.
func dashboardNeedsToken(t *testing.T, bin string) {
	base := simSnapshots(t, 10, 3000)
	st, _ := startStackFor(t, "sim", func(f *serveFlags) { f.adminToken, f.baseline = "s3cret", base })
	for range 3 {
		st.chat(t)
	}
	dom, log := chromium(t, bin, "--dump-dom", st.adminURL+"/")
	summary := element(dom, "summary")
	require.Contains(t, summary, "this proxy has an --admin-token: open the dashboard as /#token=YOUR-TOKEN", "chromium said:\n%s", log)
	require.NotContains(t, dom, "no requests yet")
	require.Contains(t, element(dom, "waterfall"), "no data: this proxy has an --admin-token")
	require.Contains(t, dom, "needs token")

	dom, _ = chromium(t, bin, "--dump-dom", st.adminURL+"/#token=wrong")
	require.Contains(t, element(dom, "summary"), "is not the proxy's --admin-token")

	dom, _ = chromium(t, bin, "--dump-dom", st.adminURL+"/#token=s3cret")
	require.Contains(t, dom, `data-ready="true"`)
	require.Regexp(t, `since start \(\d+s\): 3 requests`, element(dom, "summary"))
	// serve --baseline: the panel shows the comparison, as diff makes it.
	require.Regexp(t, `<section class="panel wide" id="baseline-panel">`, dom)
	require.Contains(t, element(dom, "baseline"), "verdict: ")
	require.Regexp(t, `<td class="">tpot</td><td class="num">10/3</td>`, element(dom, "baseline"))
}

// tickUnit is the unit of an axis tick label.
var tickUnit = regexp.MustCompile(`text-anchor="(?:end|middle)">[0-9.]+(ms|s|m)</text>`)

// chromium runs headless Chromium with no network beyond loopback and
// returns its stdout and its log (stderr).
func chromium(t *testing.T, bin string, args ...string) (stdout, log string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--user-data-dir=" + t.TempDir(),
		"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
		"--enable-logging=stderr", "--v=0",
		// Timers run in virtual time: the page polls a few times, and
		// virtual time waits for each fetch to finish.
		"--virtual-time-budget=6000"}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), "chromium %s:\n%s", strings.Join(args, " "), errOut.String())
	return out.String(), errOut.String()
}

// element returns the element with the id from a dumped DOM, up to the
// start of the next element with an id of the page's own.
func element(dom, id string) string {
	i := strings.Index(dom, `id="`+id+`"`)
	if i < 0 {
		return ""
	}
	rest := dom[i+len(id)+5:]
	if j := nextID.FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	return rest
}

var nextID = regexp.MustCompile(`id="(chart-[a-z]+|waterfall|where|goodput|goodput-note|cache|cache-note|retry|drift|legend|summary|status|others|baseline|baseline-panel|goodput-panel)"`)

func TestReadAnswerTruncated(t *testing.T) {
	chat := "data: {\"choices\":[{\"delta\":{\"content\":\"half \"}}]}\n\n"
	answer, err := readAnswer(strings.NewReader(chat), false)
	require.ErrorIs(t, err, errTruncatedStream)
	require.Equal(t, "half ", answer, "the partial answer is kept")
	answer, err = readAnswer(strings.NewReader(chat+"data: [DONE]\n\n"), false)
	require.NoError(t, err)
	require.Equal(t, "half ", answer)

	resp := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n"
	_, err = readAnswer(strings.NewReader(resp), true)
	require.ErrorIs(t, err, errTruncatedStream)
	_, err = readAnswer(strings.NewReader(resp+"event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n"), true)
	require.NoError(t, err)
}

// TestLocalAgentAndTruncation runs demo agents against the simulated engine
// directly: the local agent asks for an unreported cache and an agent's large
// cap, pauses past the engine's keep-alive every other turn, and every agent
// re-sends a stream that ended unfinished, then makes do with it.
func TestLocalAgentAndTruncation(t *testing.T) {
	s, err := sim.New(sim.Config{PrefillTokensPerSec: 1e6, DecodeTokensPerSec: 1e5, TruncateRate: 1})
	require.NoError(t, err)
	var mu sync.Mutex
	var seen []http.Header
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	w := &workload{base: ts.URL, client: ts.Client()}
	a := newAgent(7, kindLocal, rand.New(rand.NewPCG(1, 7)), w)

	path, body := a.request()
	require.Equal(t, "/v1/chat/completions", path)
	require.Contains(t, string(body), `"max_tokens":32000`)
	ctx := context.Background()
	answer, err := a.step(ctx, ctx)
	require.NoError(t, err)
	require.NotEmpty(t, answer, "the partial answer of the last attempt")
	require.Equal(t, int64(truncatedResends+1), w.truncated.Load(), "sent, re-sent twice, then taken as it is")
	require.Len(t, seen, truncatedResends+1)
	for _, h := range seen {
		require.Equal(t, "false", h.Get("X-Sim-Report-Cached"))
	}

	long := 0
	for turn := range 10 {
		a.turn = turn
		if a.pause() > sim.DefaultKeepAliveTimeout {
			long++
		}
	}
	require.Equal(t, 5, long, "every other turn outlasts the engine's keep-alive")
}

// TestDemoInferredCache: the demo shows an inferred cache figure within its
// first minute (issue 23: in a four-minute demo the dashboard said "no cold
// prefill rate yet" throughout; the cost model learned only from requests
// that found the engine idle, and the agents never leave it idle).
func TestDemoInferredCache(t *testing.T) {
	f := demoFlags{duration: time.Hour, agents: 6, listen: "127.0.0.1:0", adminListen: "127.0.0.1:0",
		snapshotDir: t.TempDir(), interval: time.Hour, seed: 3}
	require.NoError(t, f.slos.Set(demoSLOs))
	d, err := startDemo(&f, zap.NewNop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.finish(io.Discard, io.Discard) })
	var s liveStatus
	require.Eventually(t, func() bool {
		s = d.st.status(time.Now())
		return !math.IsNaN(float64(s.Recent.CacheHitInferred))
	}, time.Minute, 100*time.Millisecond, "no inferred cache figure in the demo's first minute")
	t.Logf("after %v: cache hit %.1f%% reported, %.1f%% inferred", time.Since(d.started).Round(100*time.Millisecond),
		100*float64(s.Recent.CacheHit), 100*float64(s.Recent.CacheHitInferred))
	require.Contains(t, s.block("x")[4], "inferred ")
}
