package snapshot

import (
	"fmt"

	"github.com/anvilproxy/anvilproxy/histo"
)

// metrics is the benchmark's metrics object.
func (pop *population) metrics(doc *Document) map[string]any {
	out := make(map[string]any, 159)
	for _, s := range stems {
		putStats(out, s.name, s.ms, pop.stats(s.metric, s.value))
	}
	var content, reasoning, output, prompt, promptN int64
	sources := make(map[string]int64)
	for _, p := range pop.parts {
		content += p.contentChunks
		reasoning += p.reasoningChunks
		output += p.outputTokens
		prompt += p.promptTokens
		promptN += p.promptSamples
		for s, n := range p.sources {
			sources[s] += n
		}
	}
	hitSum, hitN := pop.cacheHits()
	out["content_chunks"] = content
	out["reasoning_chunks"] = reasoning
	out["output_tokens"] = output
	out["prompt_tokens"] = prompt
	out["prompt_token_samples"] = promptN
	out["output_token_sources"] = sources
	out["prefix_cache_hit_avg"] = nan
	if hitN > 0 {
		out["prefix_cache_hit_avg"] = Num(hitSum / float64(hitN))
	}
	throughput := Num(float64(output) / (float64(doc.WallClockMs) / 1000))
	eligible := pop.complete() && doc.WallClockMs > 0 && doc.Completed > 0
	if !eligible {
		throughput = nan
	}
	out["throughput_tok_s"] = throughput
	out["throughput_performance_eligible"] = eligible
	out["content_chunks_s"] = nil
	for _, k := range benchmarkCounts {
		out[k] = pop.sum(k)
	}
	out["controlled_output_exact_adherence_rate"] = nil
	if n, ok := out["controlled_output_samples"].(int64); ok && n > 0 {
		out["controlled_output_exact_adherence_rate"] = Num(float64(out["controlled_output_exact_adherence"].(int64)) / float64(n))
	}
	return out
}

// benchmarkCounts are the metrics counts of the benchmark's own controls
// (passiveNulls): null in the proxy's documents, summed when every input
// has them.
var benchmarkCounts = [...]string{"controlled_output_exact_adherence", "controlled_output_samples",
	"controlled_output_unobservable", "request_canary_passed", "request_canary_samples"}

// sum is the sum of metrics key k over the inputs, or nil when one of
// them does not have it.
func (pop *population) sum(k string) any {
	var total int64
	for _, p := range pop.parts {
		v, ok := number(p.doc.Metrics[k])
		if !ok {
			return nil
		}
		total += int64(v)
	}
	return total
}

// cacheHits is the sum of cached/prompt over the requests that have both,
// and their number.
func (pop *population) cacheHits() (sum float64, n int64) {
	exact := true
	for _, p := range pop.parts {
		sum += p.cacheHitSum
		n += p.cacheHitN
		exact = exact && p.hitExact
	}
	if exact && len(pop.parts) > 1 {
		all := &part{timings: pop.timings}
		all.countTimings()
		return all.cacheHitSum, all.cacheHitN
	}
	return sum, n
}

// complete reports whether the token totals cover every request.
func (pop *population) complete() bool {
	for _, p := range pop.parts {
		if p.dropped > 0 {
			return false
		}
	}
	return true
}

// putStats adds a distribution's keys as the benchmark names them:
// stem_mean_ms, stem_p50_ms … for latencies, stem_mean, stem_p50 … else.
func putStats(out map[string]any, stem string, ms bool, s Stats) {
	unit := ""
	if ms {
		unit = "_ms"
	}
	ps := s.percentiles()
	for i, p := range percentiles {
		out[fmt.Sprintf("%s_p%d%s", stem, p, unit)] = *ps[i]
	}
	out[stem+"_max"+unit] = s.Max
	out[stem+"_mean"+unit] = s.Mean
	out[stem+"_mean_ci95_high"+unit] = s.CI95High
	out[stem+"_mean_ci95_low"+unit] = s.CI95Low
	out[stem+"_min"+unit] = s.Min
	out[stem+"_stddev"+unit] = s.Stddev
	out[stem+"_samples"] = s.Samples
}

// p99Metrics are the metrics of metric_population's p99 maps, keyed by
// their stems.
var p99Metrics = [...]histo.Metric{histo.MetricDecodeRate, histo.MetricE2E, histo.MetricPrefillRate, histo.MetricTPOT, histo.MetricTTFT}

// p99MinSamples is where a p99 stops being merely descriptive.
const p99MinSamples = 100

func (pop *population) metricPopulation(doc *Document) Population {
	mp := Population{
		AggregateThroughputEligible:  doc.Metrics["throughput_performance_eligible"].(bool),
		AttemptedRequests:            doc.Requests,
		ExcludedRequests:             doc.Failed,
		FailurePolicy:                "failed requests (an error on either side, a status of 400 or more or none, a truncated stream) retain sanitized timing and metadata under failures but are excluded from performance distributions",
		P99MinimumRecommendedSamples: p99MinSamples,
		P99InterpretationByMetric:    make(map[string]string, len(p99Metrics)),
		P99SamplesByMetric:           make(map[string]int64, len(p99Metrics)),
		PerformanceEligibleRequests:  doc.Completed,
		SuccessfulRequests:           doc.Completed,
	}
	fewest := int64(-1)
	for _, m := range p99Metrics {
		name := m.Phase().Name
		n := doc.Metrics[name+"_samples"].(int64)
		mp.P99SamplesByMetric[name] = n
		mp.P99InterpretationByMetric[name] = pop.p99Interpretation(n)
		if fewest < 0 || n < fewest {
			fewest = n
		}
	}
	mp.P99Interpretation = pop.p99Interpretation(fewest)
	return mp
}

func (pop *population) p99Interpretation(samples int64) string {
	method := "nearest-rank"
	if !pop.exact {
		method = "hdr-nearest-rank"
	}
	if samples < p99MinSamples {
		return "descriptive-" + method + "-only"
	}
	return method
}
