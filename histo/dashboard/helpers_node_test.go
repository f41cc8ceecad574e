package dashboard

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHelpersInNode runs the page's pure helpers in node (skipped where
// node is not installed): one unit per axis, failures in the words of
// histo/failures.go, drift events in time order.
func TestHelpersInNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	script := `
const fs = require("fs");
eval(fs.readFileSync("assets/dashboard.js", "utf8"));
const d = globalThis.anvilDashboard;
const axis = (max, step, ticks) => ticks.map(d.axisFormat(max, step)).join(", ");
console.log(axis(150e3, 50e3, [0, 50e3, 100e3, 150e3]));
console.log(axis(2500, 500, [0, 500, 1000, 1500, 2000, 2500]));
console.log(axis(400, 200, [0, 200, 400]));
console.log(axis(2.5, 1.25, [0, 1.25, 2.5]));
console.log(axis(1.2e6, 3e5, [0, 3e5, 6e5, 9e5, 1.2e6]));
console.log(d.countsText([{failed: true, error_kind: "client_gone", status: 499}, {failed: false, status: 200},
  {failed: true, status: 429}, {failed: true, status: 503, error_kind: "limited"}, {failed: true, status: 502, error_kind: "connect"}]));
console.log(d.countsText([{failed: false}]));
console.log(JSON.stringify(d.engineView({state: "ok", kind: "llamacpp", running: 1, waiting: 2, kv_cache_usage: null,
  engine_prompt_tokens: 24, proxy_prompt_tokens: 18, prompt_tokens_ratio: 1.3333, engine_output_tokens: 120, proxy_output_tokens: 100,
  output_tokens_ratio: 1.2, engine_prefill_seconds: 0.0148, proxy_prefill_seconds: 0.0088, prefill_seconds_ratio: null, shared: "yes", unaccounted_share: 0})));
console.log(JSON.stringify(d.engineView({state: "ok", kind: "vllm", shared: "unknown", unaccounted_share: 0.25}).pairs.slice(-1)));
console.log(JSON.stringify(d.engineView({state: "absent"})) + JSON.stringify(d.engineView(null)));
console.log(d.driftRows([{at: "2026-01-01T00:00:03Z"}, {at: "2026-01-01T00:00:01Z"}, {at: "2026-01-01T00:00:04Z"}, {at: "2026-01-01T00:00:02Z"}], 3).map((e) => e.at.slice(17, 19)).join(" "));
`
	cmd := exec.Command(node, "-e", script)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Equal(t, []string{
		"0, 50s, 100s, 150s",
		"0, 0.5s, 1.0s, 1.5s, 2.0s, 2.5s",
		"0, 200ms, 400ms",
		"0, 1.25ms, 2.50ms",
		"0, 5m, 10m, 15m, 20m",
		"5 requests, 4 failed (1 abandoned, 2 refused, 1 error)",
		"1 request, 0 failed",
		`{"big":"1.33×","pairs":[["engine","llamacpp"],["running","1"],["waiting","2"],["KV cache","–"],["prompt tok engine / proxy","24 / 18 (1.33×)"],["output tok engine / proxy","120 / 100 (1.20×)"],["prefill s engine / proxy","0.01 / 0.01 (–)"],["others share it","yes"]]}`,
		`[["others share it","unknown (25% of requests without usage)"]]`,
		`{"empty":"the engine exports no /metrics (ollama; llama-server without --metrics)"}{"empty":"not scraped: --engine-metrics is off"}`,
		"02 03 04",
	}, strings.Split(strings.TrimSpace(string(out)), "\n"))
}
