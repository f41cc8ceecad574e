package snapshot

import "encoding/json"

// passiveNulls are the v1 keys that describe the benchmark client's own
// controls or setup. A passive proxy has no such thing, so it writes them as
// null rather than invent a value (docs/design.md "Snapshots"); the reasons go into every
// document's timing_methodology.passive_nulls. Keys are top level, metrics.*
// or request_timings[].*.
var passiveNulls = [...]struct{ key, why string }{
	{"base_url", "the upstream URL identifies the operator's deployment; the benchmark redacts it too"},
	{"clock_domain_id", "no operator-supplied clock domain: timestamps are the proxy host's wall clock"},
	{"concurrency", "a benchmark setting; passive traffic has none (anvilproxy.max_inflight_observed is what the proxy saw)"},
	{"configuration_fingerprint", "fingerprints the benchmark's configuration"},
	{"context_distribution", "the benchmark's planned context sizes; the proxy plans none"},
	{"context_seed", "the benchmark's prompt-generation seed"},
	{"context_tokens", "the benchmark's planned context size"},
	{"controlled_output_policy", "the proxy never asks for a controlled output length"},
	{"engine", "the engine's name is not visible to the proxy"},
	{"gpu", "the GPU is not visible to the proxy"},
	{"manifest", "the benchmark's run manifest"},
	{"max_context_tokens", "the engine's context limit is not visible to the proxy"},
	{"max_tokens", "each client sets its own limit per request"},
	{"prompt_cache_mode", "the benchmark's prompt-uniqueness setting; the proxy measures cache hits instead (metrics.prefix_cache_hit_avg)"},
	{"request_canaries", "canaries are markers the benchmark injects; the proxy never changes a request"},
	{"response_words", "the benchmark's controlled output length"},
	{"sampling", "sampling parameters are the clients'; the proxy does not parse them"},
	{"serve_flags", "the engine's flags are not visible to the proxy"},
	{"shared_prefix_tokens", "a benchmark setting; prefix reuse is measured per request (request_timings[].prefix_reuse)"},
	{"source_recipe", "the benchmark's recipe"},
	{"tier", "the benchmark's tier label"},
	{"metrics.content_chunks_s", "not defined by the benchmark's files (null there as well)"},
	{"metrics.controlled_output_exact_adherence", "no controlled output"},
	{"metrics.controlled_output_exact_adherence_rate", "no controlled output"},
	{"metrics.controlled_output_samples", "no controlled output"},
	{"metrics.controlled_output_unobservable", "no controlled output"},
	{"metrics.request_canary_passed", "no canaries"},
	{"metrics.request_canary_samples", "no canaries"},
	{"request_timings[].controlled_output", "no controlled output"},
	{"request_timings[].planned_context_tokens", "the proxy plans no context"},
	{"request_timings[].request_canary", "no canaries"},
	{"request_timings[].visible_content_truncated", "the proxy captures no content"},
}

// methodology is the proxy's timing_methodology: its own definitions, in
// the benchmark's keys where it has them (docs/design.md "Stamps and phases").
var methodology = map[string]string{
	"agent_time":               "anvilproxy.conversations: turns are linked into conversations by the prefix tracker; a turn's agent gap is t_recv - the latest t_client_done of its conversation (none when that response had not ended, or the conversation was idle 30 min or evicted from the 4096 followed), its engine time t_recv - t_end; a conversation's shares are of its wall time, first t_recv to last t_client_done",
	"artifact_timestamps":      "Unix nanoseconds from the proxy host's wall clock at the window's start and end and at each request's t_recv; independent artifacts may align them only as far as their hosts' clocks agree",
	"clock":                    "proxy monotonic clock (Go time.Time monotonic readings); every phase is a difference of two proxy stamps: t_recv (request headers fully read from the client), t_admit (past the optional --max-inflight limiter; = t_recv without one), t_sent (request written upstream), t_headers, t_first_event, t_first_output, t_first_content, t_last_token, t_end (upstream stream finished: [DONE], message_stop or EOF), t_client_done (last byte written and flushed to the client)",
	"concurrency_knee":         "anvilproxy.concurrency: requests by the number of others in flight upstream when admitted (64+ together); queue as in queue, service = prefill + generation, over successful requests with a known split; the knee is the lowest level where queue p95 >= 0.5 x service p50; the reading compares the median level with the knee, or is rejecting when 5% or more of the requests at or above the p90 level (and limiter refusals) got 429 or 503",
	"connect":                  "time acquiring the upstream connection (a dial when a new one was needed)",
	"controlled_output":        "not applicable: the proxy observes traffic passively and never asks for a controlled output length; the controlled_output keys are null",
	"decode":                   "(completion tokens - 1) / generation, completion tokens from the stream's usage (else counted output events, output_token_source chunks); may include reasoning tokens",
	"distributions":            "over successful requests only (failed requests are listed under failures): request-level mean, sample standard deviation, normal-approximation 95% confidence interval of the mean (mean +/- 1.96 sd / sqrt(n)), min, nearest-rank p25, p50, p75, p90, p95, p99 (rank ceil(p/100 * n)), and max; a statistic the sample does not define (stddev and interval below two samples) is null",
	"e2e":                      "t_end - t_recv",
	"effective_prefill":        "prompt tokens / time to first output; includes proxy queue, connect, engine queue, prefill and the first token",
	"failures":                 "a request failed when it ended in an error on either side, with a status of 400 or more or none, or with a truncated stream (a known protocol's stream that ended without its end marker: error_kind truncated, status 200 notwithstanding); it keeps sanitized metadata and the timings known when it failed, never content",
	"generation":               "t_end - t_first_output",
	"hdr":                      "anvilproxy.histograms carries every phase as an HdrHistogram (3 significant digits, V2 compressed, base64) so that windows and replicas merge exactly; when a window dropped request records (anvilproxy.dropped_records > 0) its distributions come from these histograms (anvilproxy.percentile_source = hdr): percentiles are the highest value of the nearest-rank bucket, within 0.1%",
	"mean_inter_token_latency": "legacy key for TPOT: generation / (completion tokens - 1), identical to tpot; not raw per-event gaps (those are anvilproxy.distributions.inter_event_ms)",
	"measurement_quality":      "anvilproxy.measurement_quality: a probe ticks at a fixed period (probe_period_ms; 250 ms by default) and measures how late each tick is handled (timer and goroutine scheduling: the delay any stamp may carry) and reads Linux PSI some avg10 for cpu, io and memory every 2 s; a window is noisy when the overshoot p99 or the peak cpu or memory pressure exceeds the thresholds it states, unknown when the probe did not run",
	"p99":                      "numeric nearest-rank p99 is always given; it is descriptive only below 100 samples",
	"prefill":                  "time to first output - queue - connect: prompt processing plus the first token",
	"prefix_and_retry":         "anvilproxy.prefix, anvilproxy.retry and request_timings[].prefix_reuse and retry_attempt are null until prefix-drift and retry tracking report them",
	"prefix_cache_hit":         "metrics.prefix_cache_hit_avg is the mean over successful requests of cached prompt tokens / prompt tokens, both from the engine's usage",
	"prompt_ledger":            "anvilproxy.prompt_ledger: each tracked prompt's canonical bytes (as the prefix tracker hashes them) split into system, tools, history (messages up to and including the last assistant message) and last turn (the messages after it); tokens are estimated as bytes / 4; completions prompts have no parts",
	"proxy_queue":              "t_admit - t_recv: the wait in the proxy's own limiter",
	"queue":                    "all waiting before prefill: the proxy limiter's wait plus the engine queue, from the best source (queue_source): server (the engine reported it), limiter (the proxy's limiter held the request; the engine queue is ~0), occupancy (on an engine of S slots served first come first served, as learned from the streams seen at once or given by --engine-slots and corrected by evidence, anvilproxy.engine_slots: a request that arrived with n >= S requests ahead began when the (n-S+1)-th of them produced its last token), model (the timeline could not place it; learned cold prefill rate: prefill = uncached prompt tokens / rate), none (unknown: queue_ms and prefill_ms are null, never 0)",
	"cache_inferred":           "request_timings[].cache_inferred_tokens and anvilproxy.cache.inferred: prompt tokens - prefill time x the learned cold prefill rate (uncached prompt tokens per second of requests that found the engine idle, cache hits left out), clamped to [0, prompt tokens]; null under 64 prompt tokens, before 8 cold samples, or with queue_source model; never mixed with the engine-reported cached_tokens (anvilproxy.cache.engine_reported)",
	"reasoning":                "t_first_content - t_first_output when reasoning came first, else 0",
	"request_canaries":         "not applicable: the proxy never changes a request; the request_canary keys are null",
	"throughput":               "output tokens of successful requests / the wall-clock time the window covers (merged: the union of the windows); null when request records were dropped",
	"time_to_first_output":     "t_first_output - t_recv: the first event with a non-empty reasoning, content or tool-call delta",
	"tpot":                     "generation / (completion tokens - 1); identical to mean_inter_token_latency",
	"ttft":                     "t_first_content - t_recv: the first event with a non-empty content or tool-call delta (includes reasoning)",
	"visible_generation":       "t_end - t_first_content (= e2e - ttft)",
	"window":                   "one document per measurement window (--snapshot-interval); a request belongs to the window in which it finished",
}

// methodologyJSON is the timing_methodology object of the proxy's documents.
var methodologyJSON = func() json.RawMessage {
	byKey := make(map[string]string, len(passiveNulls))
	for _, n := range passiveNulls {
		byKey[n.key] = n.why
	}
	doc := make(map[string]any, len(methodology)+1)
	for k, v := range methodology {
		doc[k] = v
	}
	doc["passive_nulls_by_key"] = byKey
	b, err := json.Marshal(doc)
	if err != nil {
		panic("BUG: timing_methodology does not marshal: " + err.Error())
	}
	return b
}()
