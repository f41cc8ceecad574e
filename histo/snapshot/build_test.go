package snapshot

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
)

// jsonType is a value's JSON type, telling integers from floats as the
// benchmark's Python writer does (519 vs 519.0).
func jsonType(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case json.Number:
		if strings.ContainsAny(v.String(), ".eE") {
			return "float"
		}
		return "int"
	case string:
		return "string"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}

// sameShape checks that got has exactly want's keys plus added, each of
// want's keys with want's JSON type, or null where nullable allows it.
func sameShape(t *testing.T, where string, want, got map[string]any, added []string, nullable map[string]bool) {
	t.Helper()
	wantKeys := slices.Sorted(func(yield func(string) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
	})
	wantKeys = append(wantKeys, added...)
	slices.Sort(wantKeys)
	var gotKeys []string
	for k := range got {
		gotKeys = append(gotKeys, k)
	}
	slices.Sort(gotKeys)
	require.Equal(t, wantKeys, gotKeys, "%s: keys", where)
	for k, w := range want {
		g := got[k]
		switch {
		case g == nil:
			require.True(t, w == nil || nullable[k], "%s%s: null, reference has %s", where, k, jsonType(w))
		case w != nil:
			require.Equal(t, jsonType(w), jsonType(g), "%s%s: type", where, k)
		}
	}
	for _, k := range added {
		require.NotContains(t, want, k, "%s%s: an addition the reference already has", where, k)
	}
}

// nullableKeys are passiveNulls' keys under prefix.
func nullableKeys(prefix string) map[string]bool {
	out := make(map[string]bool)
	for _, n := range passiveNulls {
		rest, ok := strings.CutPrefix(n.key, prefix)
		if ok && (prefix != "" || !strings.Contains(rest, ".")) {
			out[rest] = true
		}
	}
	return out
}

func TestDocumentShapeMatchesReference(t *testing.T) {
	ref := generic(t, readReference(t))
	doc := build(t, window(t, histo.Config{}, 0, 24, 6))
	require.Equal(t, int64(4), doc.Failed, "the window has failures")
	got := generic(t, doc)

	sameShape(t, "", ref, got, []string{"anvilproxy"}, nullableKeys(""))
	sameShape(t, "metrics.", ref["metrics"].(map[string]any), got["metrics"].(map[string]any), nil, nullableKeys("metrics."))
	require.Len(t, got["metrics"], 159)
	refTiming := ref["request_timings"].([]any)[0].(map[string]any)
	for i, rt := range got["request_timings"].([]any) {
		sameShape(t, "request_timings[].", refTiming, rt.(map[string]any), addedTimingKeys[:], nullableKeys("request_timings[]."))
		require.Less(t, i, 20)
	}
	// The proxy's own keys.
	require.Equal(t, Schema, got["schema"])
	require.Equal(t, Protocol, got["measurement_protocol"])
	require.Equal(t, "anvilproxy-20261129T230500.123Z", got["run_id"])
	require.Equal(t, "2026-11-29T23:05:00Z", got["started_at"])
	require.Equal(t, json.Number(fmt.Sprint(t0.UnixNano())), got["started_at_unix_ns"])
	require.Equal(t, json.Number("60000.0"), got["wall_clock_ms"])
	require.Equal(t, "qwen", got["model"])
	require.Nil(t, got["base_url"], "operator identity is never written")
	methodology := got["timing_methodology"].(map[string]any)
	for _, k := range []string{"clock", "ttft", "time_to_first_output", "tpot", "queue", "prefill", "distributions"} {
		require.NotEmpty(t, methodology[k], k)
	}
	require.Len(t, methodology["passive_nulls_by_key"], len(passiveNulls))
	require.Contains(t, methodology["clock"], "t_recv (request headers fully read from the client)")
}

func TestBuildCountsAndFailures(t *testing.T) {
	doc := build(t, window(t, histo.Config{}, 0, 24, 6))
	require.Equal(t, int64(24), doc.Requests)
	require.Equal(t, int64(20), doc.Completed)
	require.Equal(t, int64(4), doc.Failed)
	require.Len(t, doc.RequestTimings, 20)
	require.Len(t, doc.Failures, 4)
	require.Equal(t, int64(24), doc.ResponsesReceived)

	var f map[string]any
	require.NoError(t, json.Unmarshal(doc.Failures[0], &f))
	require.Equal(t, map[string]any{
		"cache_inferred_tokens": nil, "cached_tokens": 2250.0, "e2e_ms": 2751.0, "error_kind": "upstream_broken", "error_side": "upstream",
		"model": "qwen", "output_tokens": 105.0, "prefill_ms": 484.5, "prompt_tokens": 10500.0, "queue_ms": 0.0,
		"queue_source": "occupancy", "request_index": 5.0, "retry_attempt": 0.0, "route": "chat",
		"started_at_unix_ns": float64(t0.Add(5 * time.Second).UnixNano()), "status": 200.0, "time_to_first_output_ms": 485.0,
		"truncated": true, "ttft_ms": nil,
	}, f, "sanitized: metadata and the timings known when it failed")

	m := doc.Metrics
	var out, prompt, content, reasoning int64
	for _, rt := range doc.RequestTimings {
		out += int64(rt.OutputTokens)
		prompt += int64(rt.PromptTokens)
		content += int64(rt.ContentChunks)
		reasoning += int64(rt.ReasoningChunks)
	}
	require.Equal(t, out, m["output_tokens"])
	require.Equal(t, prompt, m["prompt_tokens"])
	require.Equal(t, content, m["content_chunks"])
	require.Equal(t, reasoning, m["reasoning_chunks"])
	require.Equal(t, map[string]int64{"usage": 20}, m["output_token_sources"])
	require.InDelta(t, float64(out)/60, float64(m["throughput_tok_s"].(Num)), 1e-9)
	require.Equal(t, true, m["throughput_performance_eligible"])
	require.Equal(t, int64(20), m["ttft_samples"], "failed requests are excluded from distributions")

	ext := doc.Anvilproxy
	require.Equal(t, "exact", ext.PercentileSource)
	require.Equal(t, int64(24), ext.Goodput.Requests)
	require.Len(t, ext.Goodput.Curves, 2)
	require.Len(t, ext.Histograms, int(histo.NumMetrics))
	require.Equal(t, "us", ext.Histograms["ttft"].Unit)
	require.Equal(t, "mtok/s", ext.Histograms["decode_tok_s"].Unit)
	require.Equal(t, "tokens", ext.Histograms["prompt_tokens"].Unit)
	var sources int64
	for _, s := range ext.QueueSplit {
		sources += s.Requests
	}
	require.Equal(t, int64(24), sources)
	require.Positive(t, ext.QueueSplit["server"].QueueMs.Samples)
	require.Positive(t, ext.QueueSplit["limiter"].QueueMs.Samples)
	require.Positive(t, ext.QueueSplit["occupancy"].QueueMs.Samples, "the rest are placed on the engine's timeline")
	require.Len(t, ext.Distributions, len(phases))
	split := ext.QueueSplit
	require.Equal(t, ext.Distributions["queue_ms"].Samples,
		split["server"].QueueMs.Samples+split["limiter"].QueueMs.Samples+split["occupancy"].QueueMs.Samples+split["model"].QueueMs.Samples)
	var cache histo.CacheSection
	require.NoError(t, json.Unmarshal(ext.Cache, &cache))
	require.Equal(t, int64(24), cache.Requests)
	require.Equal(t, int64(24), cache.EngineReported.Requests, "every synthetic trace reports cached tokens")
	var slots histo.SlotsSection
	require.NoError(t, json.Unmarshal(ext.EngineSlots, &slots))
	require.Equal(t, histo.SlotsLearned, slots.State)
	require.Zero(t, split["none"].QueueMs.Samples, "no split: queue is null, not 0")
	var ps histo.PrefixSection
	require.NoError(t, json.Unmarshal(ext.Prefix, &ps))
	require.Zero(t, ps.Tracked, "synthetic traces carry no prefix result")
	var rs histo.RetrySection
	require.NoError(t, json.Unmarshal(ext.Retry, &rs))
	require.Equal(t, rs.Attempts, rs.LogicalRequests, "no retries among distinct traces")
	require.Positive(t, rs.Attempts)
	require.Equal(t, histo.Count(1), ext.MaxInflightObserved)
	require.Equal(t, "2026-11-29T23:05:00.123Z", ext.WindowStart)
}

func TestBuildEmptyWindow(t *testing.T) {
	doc := build(t, window(t, histo.Config{}, 0, 0, 0))
	got := generic(t, doc)
	require.Nil(t, got["model"])
	require.Equal(t, []any{}, got["request_timings"])
	require.Equal(t, []any{}, got["failures"])
	require.Nil(t, got["metrics"].(map[string]any)["ttft_p50_ms"])
	require.Equal(t, json.Number("0"), got["metrics"].(map[string]any)["ttft_samples"])
}

func TestHandlerServesCurrentWindow(t *testing.T) {
	r, _ := newRecorder(t, histo.Config{})
	record(r, 0, 3, 0)
	rec := httptest.NewRecorder()
	Handler(r).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/snapshot", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	doc, err := Decode(rec.Body.Bytes())
	require.NoError(t, err)
	require.Equal(t, int64(3), doc.Requests)
	require.Len(t, doc.RequestTimings, 3)
	require.Equal(t, int64(3), doc.Anvilproxy.Goodput.Requests)

	// Current does not end the window.
	record(r, 3, 4, 0)
	require.Equal(t, 4, r.Rotate().Requests.Len())
}

// TestEngineFiguresInTimings: what the engine reported of a request is in
// its request_timings entry beside the proxy's figures (ollama's four
// durations here), and null where the engine reported nothing.
func TestEngineFiguresInTimings(t *testing.T) {
	r, _ := newRecorder(t, histo.Config{})
	reported, silent := trace(0), trace(1)
	reported.ServerPrefill, reported.ServerDecode = ms2d(210), ms2d(1900)
	reported.ServerTotal, reported.ServerLoad = ms2d(2450.5), ms2d(3.25)
	reported.ServerInference, reported.ServerPromptEval = ms2d(2110), 812
	silent.ServerDecode, silent.ServerTotal, silent.ServerLoad = -1, -1, -1
	silent.ServerInference, silent.ServerPromptEval = -1, -1
	r.Record(&reported)
	r.Record(&silent)
	doc := roundTrip(t, build(t, r.Rotate()))
	require.Len(t, doc.RequestTimings, 2)
	got, none := doc.RequestTimings[0], doc.RequestTimings[1]
	require.Equal(t, []float64{210, 1900, 2450.5, 3.25},
		[]float64{float64(got.EnginePrefillMs), float64(got.EngineDecodeMs), float64(got.EngineTotalMs), float64(got.EngineLoadMs)})
	require.Equal(t, 2110.0, float64(got.EngineInferenceMs))
	require.Equal(t, histo.Count(812), got.EnginePromptEvalTokens)
	for _, v := range []Num{none.EnginePrefillMs, none.EngineDecodeMs, none.EngineTotalMs, none.EngineLoadMs, none.EngineInferenceMs} {
		require.True(t, math.IsNaN(float64(v)), "null where the engine said nothing")
	}
	require.Equal(t, histo.Count(-1), none.EnginePromptEvalTokens)
	require.Equal(t, histo.Count(-1), none.EngineRunningAtAdmit, "no engine /metrics")
}

// TestSharedNotes: the snapshot says what the engine section's verdict on
// other front doors meant for the split, and only the verdict: a ratio
// above SharedPromptRatio with many requests of unknown prompt tokens is
// "cannot be told", not "others share the engine".
func TestSharedNotes(t *testing.T) {
	require.Empty(t, sharedNotes(nil))
	require.Empty(t, sharedNotes(&histo.EngineSection{Shared: histo.SharedNo, PromptRatio: 1}))
	yes := sharedNotes(&histo.EngineSection{Shared: histo.SharedYes, PromptRatio: 2, UnaccountedShare: 0})
	require.Len(t, yes, 1)
	require.Contains(t, yes[0], "2.00× the prompt tokens")
	require.Contains(t, yes[0], "other front doors share the engine")
	unknown := sharedNotes(&histo.EngineSection{Shared: histo.SharedUnknown, PromptRatio: 1.5, UnaccountedShare: 0.3})
	require.Len(t, unknown, 1)
	require.Contains(t, unknown[0], "30% of its requests")
	require.Contains(t, unknown[0], "cannot be told")
	require.NotContains(t, unknown[0], "other front doors share the engine,")
}
