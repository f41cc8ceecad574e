package sim

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// scrape reads /metrics into a map from series ("name" or
// "name{labels}", as written) to value, checking that every series has
// its # TYPE line first.
func (v *virtualSim) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://sim/metrics", nil)
	require.NoError(t, err)
	resp, err := v.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/plain")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := map[string]float64{}
	typed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			typed[strings.Fields(name)[0]] = true
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		series := line[:i]
		f, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		name, _, _ := strings.Cut(series, "{")
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		require.True(t, typed[name] || typed[base], "no # TYPE before %s", line)
		out[series] = f
	}
	return out
}

// hold starts a stream that holds a slot (or waits for one) until its
// context ends.
func (v *virtualSim) hold(t *testing.T, ctx context.Context, body map[string]any, headers ...string) {
	t.Helper()
	body["stream"] = true
	go func() {
		req := mustRequest(t, ctx, "http://sim/v1/chat/completions", body, headers...)
		if resp, err := v.client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	synctest.Wait()
}

// TestMetricsVLLM: vLLM's names, labels and meanings: running and waiting
// follow the slots, KV usage the reservations, the prefix-cache counters
// the queried and hit tokens, the histograms the per-request truth.
func TestMetricsVLLM(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Slots = 1
		cfg.Model = "m"
		v := startVirtual(t, cfg)
		const l = `{engine="0",model_name="m"}`
		ctx, cancel := context.WithCancel(context.Background())
		v.hold(t, ctx, convBody("a", 1), "X-Sim-Prefill", "1h")
		v.hold(t, ctx, convBody("b", 1))
		m := v.scrape(t)
		require.Equal(t, 1.0, m["vllm:num_requests_running"+l])
		require.Equal(t, 1.0, m["vllm:num_requests_waiting"+l])
		require.Equal(t, m["vllm:kv_cache_usage_perc"+l], m["vllm:gpu_cache_usage_perc"+l])
		st := v.s.Stats()
		require.Equal(t, float64(st.KVTokens)/float64(16<<16), m["vllm:kv_cache_usage_perc"+l])
		require.Equal(t, 1.0, m[`vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",kv_cache_size_tokens="1048576",num_gpu_blocks="65536"}`],
			"the cache's size in the info gauge's labels")
		require.Positive(t, st.KVTokens)
		cancel()
		synctest.Wait()
		require.Zero(t, v.s.Stats().KVTokens, "reservations end with the slot")

		ids := []string{"q1", "q2", "q3"}
		v.burst(t, func(id string) map[string]any { return convBody("c", len(id)) }, ids, "X-Sim-Prefill", "20ms")
		m = v.scrape(t)
		var queue, prompt, cached, generated float64
		for _, id := range ids {
			tr := truthOf(t, v.s, id)
			queue += tr.Queue.Seconds()
			prompt += float64(tr.PromptTokens)
			cached += float64(tr.CachedTokens)
			generated += float64(tr.CompletionTokens)
		}
		require.Positive(t, cached)
		st = v.s.Stats()
		require.Equal(t, float64(st.PromptTokens), m["vllm:prefix_cache_queries_total"+l])
		require.Equal(t, float64(st.CachedTokens), m["vllm:prefix_cache_hits_total"+l])
		require.Equal(t, prompt, m["vllm:prompt_tokens_total"+l], "prompts whose prefill finished, cached included")
		require.Equal(t, generated, m["vllm:generation_tokens_total"+l])
		require.Equal(t, 3.0, m[`vllm:request_success_total{engine="0",finished_reason="length",model_name="m"}`])
		require.Equal(t, 2.0, m[`vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"}`])
		require.Equal(t, 3.0, m["vllm:request_queue_time_seconds_count"+l])
		require.InDelta(t, queue, m["vllm:request_queue_time_seconds_sum"+l], 1e-9)
		require.Positive(t, queue, "the burst queued")
		require.InDelta(t, 0.06, m["vllm:request_prefill_time_seconds_sum"+l], 1e-9)
		require.Equal(t, 3.0, m[`vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="+Inf"}`])
		for _, name := range []string{"vllm:request_decode_time_seconds_count", "vllm:request_inference_time_seconds_count", "vllm:e2e_request_latency_seconds_count"} {
			require.Equal(t, 3.0, m[name+l], name)
		}
	})
}

// TestMetricsLlamaCpp: llama-server's names: processing and deferred
// follow the slots; prompt tokens exclude the cached ones, which count
// apart; prompt seconds are the prefills' (not the slot switches').
func TestMetricsLlamaCpp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineLlamaCpp
		cfg.Slots = 1
		v := startVirtual(t, cfg)
		ctx, cancel := context.WithCancel(context.Background())
		v.hold(t, ctx, convBody("a", 1), "X-Request-Id", "held", "X-Sim-Prefill", "10ms", "X-Sim-Event-Gap", "1h")
		v.hold(t, ctx, convBody("b", 1))
		time.Sleep(20 * time.Millisecond)
		m := v.scrape(t)
		require.Equal(t, 1.0, m["llamacpp:requests_processing"])
		require.Equal(t, 1.0, m["llamacpp:requests_deferred"])
		cancel()
		synctest.Wait()

		v.burst(t, func(id string) map[string]any { return convBody("a", len(id)) }, []string{"t1", "t22"})
		m = v.scrape(t)
		var uncached, cached, seconds, predicted float64
		for _, id := range []string{"t1", "t22"} {
			tr := truthOf(t, v.s, id)
			uncached += float64(tr.PromptTokens - tr.CachedTokens)
			cached += float64(tr.CachedTokens)
			seconds += tr.Prefill.Seconds()
			predicted += float64(tr.CompletionTokens)
		}
		require.Positive(t, cached)
		held := float64(truthOf(t, v.s, "held").PromptTokens) // prefilled cold, then left in decode
		require.Equal(t, held+uncached, m["llamacpp:prompt_tokens_total"], "computed tokens only")
		require.Equal(t, cached, m["llamacpp:prompt_tokens_cached_total"])
		require.InDelta(t, seconds+0.010, m["llamacpp:prompt_seconds_total"], 1e-9, "the held request's 10 ms prefill, then t1's and t22's")
		require.Equal(t, predicted+1, m["llamacpp:tokens_predicted_total"], "and the held request's first token")
		require.Positive(t, m["llamacpp:prompt_tokens_seconds"])
		require.Zero(t, v.scrape(t)["llamacpp:prompt_tokens_seconds"], "the throughput gauges average since the last read")
		for series := range m {
			require.NotContains(t, series, "vllm:")
		}
	})
}

// TestMetricsNone: ollama has no /metrics.
func TestMetricsNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineOllama
		v := startVirtual(t, cfg)
		req, err := http.NewRequest(http.MethodGet, "http://sim/metrics", nil)
		require.NoError(t, err)
		resp, err := v.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
	})
}

// TestMetricsUncompressed: /metrics is plain text even to a client that
// accepts gzip, so a proxy's byte count is the body's.
func TestMetricsUncompressed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := startVirtual(t, fast())
		req, err := http.NewRequest(http.MethodGet, "http://sim/metrics", nil)
		require.NoError(t, err)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := v.client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Empty(t, resp.Header.Get("Content-Encoding"))
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Contains(t, string(b), "# TYPE vllm:num_requests_running gauge")
	})
}
