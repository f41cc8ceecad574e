// Package engine scrapes the inference engine's own Prometheus /metrics
// (vLLM, llama.cpp, SGLang, TGI; docs/engines.md lists the names) and keeps
// a small ring of what it read: the engine's running and waiting counts,
// KV-cache use, and its token, cache and prefill totals. The split uses
// the counts as evidence (Scraper.LoadAt, histo.EngineLoad), the Recorder
// the totals for an agreement check against the proxy's own.
//
// It is a leaf: the standard library and the Prometheus text parser
// (github.com/prometheus/common/expfmt) only. The scraper runs on its own
// goroutine, never on a request's path.
package engine

import (
	"io"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Kind is the engine a /metrics page came from, told by its metric names.
type Kind uint8

// The engines recognized.
const (
	KindUnknown Kind = iota
	KindVLLM
	KindLlamaCpp
	KindSGLang
	KindTGI
)

var kindNames = [...]string{"unknown", "vllm", "llamacpp", "sglang", "tgi"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Reading is one scrape of the engine, summed over label sets (a vLLM
// with several engine cores, a model_name label). Every value is NaN when
// the engine does not export it. Counters are the engine's totals since it
// started.
type Reading struct {
	Kind          Kind
	Running       float64 // requests being computed (in a slot, in the batch)
	Waiting       float64 // requests queued in the engine
	KVCacheUsage  float64 // fraction of the KV cache in use, 0..1
	KVCapacity    float64 // tokens the KV cache holds (vLLM's cache_config_info labels)
	CacheHitRate  float64 // the engine's own prefix-cache hit rate gauge (SGLang), 0..1
	PromptTokens  float64 // prompt tokens, cache hits included
	CachedTokens  float64 // prompt tokens served from the prefix cache
	CacheQueries  float64 // prompt tokens looked up in the prefix cache (vLLM)
	OutputTokens  float64 // generated tokens
	PrefillSecs   float64 // time spent on prompts (llama.cpp prompt_seconds_total; vLLM, SGLang, TGI: their prefill histogram's sum)
	QueueSecs     float64 // time requests waited (the queue histogram's sum)
	QueueRequests float64 // requests in the queue histogram (its count)
}

func unknownReading() Reading {
	n := math.NaN()
	return Reading{Running: n, Waiting: n, KVCacheUsage: n, KVCapacity: n, CacheHitRate: n, PromptTokens: n, CachedTokens: n,
		CacheQueries: n, OutputTokens: n, PrefillSecs: n, QueueSecs: n, QueueRequests: n}
}

// field says where one metric family goes in a Reading.
type field struct {
	kind Kind
	set  func(r *Reading, v float64)
	part part // which number of the family
}

type part uint8

const (
	value  part = iota // a gauge's, counter's or untyped sample's value
	hsum               // a histogram's sum
	hcount             // a histogram's count
)

// families maps the metric names of each engine to Reading fields. Names
// are the exposition's (prometheus_client adds _total to counters). Where
// an engine renamed a metric, both names are listed; the newer one wins by
// being read last (vLLM gpu_cache_usage_perc → kv_cache_usage_perc,
// gpu_prefix_cache_* → prefix_cache_*).
var families = map[string]field{
	// vLLM v1 (vllm/v1/metrics/loggers.py)
	"vllm:num_requests_running":           {KindVLLM, func(r *Reading, v float64) { r.Running = v }, value},
	"vllm:num_requests_waiting":           {KindVLLM, func(r *Reading, v float64) { r.Waiting = v }, value},
	"vllm:gpu_cache_usage_perc":           {KindVLLM, func(r *Reading, v float64) { r.KVCacheUsage = v }, value},
	"vllm:kv_cache_usage_perc":            {KindVLLM, func(r *Reading, v float64) { r.KVCacheUsage = v }, value},
	"vllm:gpu_prefix_cache_queries_total": {KindVLLM, func(r *Reading, v float64) { r.CacheQueries = v }, value},
	"vllm:gpu_prefix_cache_hits_total":    {KindVLLM, func(r *Reading, v float64) { r.CachedTokens = v }, value},
	"vllm:prefix_cache_queries_total":     {KindVLLM, func(r *Reading, v float64) { r.CacheQueries = v }, value},
	"vllm:prefix_cache_hits_total":        {KindVLLM, func(r *Reading, v float64) { r.CachedTokens = v }, value},
	"vllm:prompt_tokens_total":            {KindVLLM, func(r *Reading, v float64) { r.PromptTokens = v }, value},
	"vllm:generation_tokens_total":        {KindVLLM, func(r *Reading, v float64) { r.OutputTokens = v }, value},
	"vllm:request_prefill_time_seconds":   {KindVLLM, func(r *Reading, v float64) { r.PrefillSecs = v }, hsum},
	"vllm:request_queue_time_seconds":     {KindVLLM, func(r *Reading, v float64) { r.QueueSecs = v }, hsum},
	"vllm:request_queue_time_seconds#n":   {KindVLLM, func(r *Reading, v float64) { r.QueueRequests = v }, hcount},
	// llama.cpp (tools/server, --metrics)
	"llamacpp:requests_processing":        {KindLlamaCpp, func(r *Reading, v float64) { r.Running = v }, value},
	"llamacpp:requests_deferred":          {KindLlamaCpp, func(r *Reading, v float64) { r.Waiting = v }, value},
	"llamacpp:kv_cache_usage_ratio":       {KindLlamaCpp, func(r *Reading, v float64) { r.KVCacheUsage = v }, value},
	"llamacpp:prompt_tokens_total":        {KindLlamaCpp, func(r *Reading, v float64) { r.PromptTokens = v }, value},
	"llamacpp:prompt_tokens_cached_total": {KindLlamaCpp, func(r *Reading, v float64) { r.CachedTokens = v }, value},
	"llamacpp:tokens_predicted_total":     {KindLlamaCpp, func(r *Reading, v float64) { r.OutputTokens = v }, value},
	"llamacpp:prompt_seconds_total":       {KindLlamaCpp, func(r *Reading, v float64) { r.PrefillSecs = v }, value},
	// SGLang (python/sglang/srt/metrics/collector.py)
	"sglang:num_running_reqs":        {KindSGLang, func(r *Reading, v float64) { r.Running = v }, value},
	"sglang:num_queue_reqs":          {KindSGLang, func(r *Reading, v float64) { r.Waiting = v }, value},
	"sglang:token_usage":             {KindSGLang, func(r *Reading, v float64) { r.KVCacheUsage = v }, value},
	"sglang:cache_hit_rate":          {KindSGLang, func(r *Reading, v float64) { r.CacheHitRate = v }, value},
	"sglang:prompt_tokens_total":     {KindSGLang, func(r *Reading, v float64) { r.PromptTokens = v }, value},
	"sglang:generation_tokens_total": {KindSGLang, func(r *Reading, v float64) { r.OutputTokens = v }, value},
	// TGI (router/src, metrics crate: histograms without _seconds)
	"tgi_batch_current_size":       {KindTGI, func(r *Reading, v float64) { r.Running = v }, value},
	"tgi_queue_size":               {KindTGI, func(r *Reading, v float64) { r.Waiting = v }, value},
	"tgi_request_input_length":     {KindTGI, func(r *Reading, v float64) { r.PromptTokens = v }, hsum},
	"tgi_request_generated_tokens": {KindTGI, func(r *Reading, v float64) { r.OutputTokens = v }, hsum},
	"tgi_request_queue_duration":   {KindTGI, func(r *Reading, v float64) { r.QueueSecs = v }, hsum},
	"tgi_request_queue_duration#n": {KindTGI, func(r *Reading, v float64) { r.QueueRequests = v }, hcount},
}

// order fixes which of two names for one field is read last: the newer.
var order = []string{
	"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
	"vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_queries_total",
	"vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits_total",
}

// Parse reads a Prometheus text exposition into a Reading. A page with
// none of the names above has Kind KindUnknown. llama.cpp's
// prompt_tokens_total leaves out cache hits since the counter
// prompt_tokens_cached_total exists; PromptTokens then adds them back, so
// that every engine's PromptTokens counts the whole prompt as usage does.
func Parse(in io.Reader) (Reading, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(in)
	r := unknownReading()
	if err != nil {
		return r, err
	}
	seen := map[string]bool{}
	read := func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		for _, key := range []string{name, name + "#n"} {
			f, ok := families[key]
			mf := fams[name]
			if !ok || mf == nil {
				continue
			}
			if v, ok := total(mf, f.part); ok {
				f.set(&r, v)
				r.Kind = f.kind
			}
		}
	}
	for _, name := range order {
		read(name)
	}
	for name := range families {
		read(strings.TrimSuffix(name, "#n"))
	}
	if mf := fams[cacheConfigInfo]; mf != nil {
		r.KVCapacity = kvCapacity(mf)
	}
	if r.Kind == KindLlamaCpp && !math.IsNaN(r.CachedTokens) && !math.IsNaN(r.PromptTokens) {
		r.PromptTokens += r.CachedTokens
	}
	return r, nil
}

// total sums one number of a family over its label sets.
func total(mf *dto.MetricFamily, p part) (float64, bool) {
	sum, any := 0.0, false
	for _, m := range mf.GetMetric() {
		var v float64
		switch {
		case p == hsum && m.GetHistogram() != nil:
			v = m.GetHistogram().GetSampleSum()
		case p == hcount && m.GetHistogram() != nil:
			v = float64(m.GetHistogram().GetSampleCount())
		case p == value && m.GetGauge() != nil:
			v = m.GetGauge().GetValue()
		case p == value && m.GetCounter() != nil:
			v = m.GetCounter().GetValue()
		case p == value && m.GetUntyped() != nil:
			v = m.GetUntyped().GetValue()
		default:
			continue
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		sum, any = sum+v, true
	}
	return sum, any
}

// cacheConfigInfo is vLLM's info gauge (value 1) whose labels carry its
// cache configuration (vllm/v1/metrics/loggers.py, CacheConfig's
// metrics_info): block_size and num_gpu_blocks, and in later versions
// kv_cache_size_tokens.
const cacheConfigInfo = "vllm:cache_config_info"

// kvCapacity reads the KV cache's size in tokens from cacheConfigInfo's
// labels, summed over its label sets (one per engine core): NaN when no
// set carries it ("None" before the cache is allocated).
func kvCapacity(mf *dto.MetricFamily) float64 {
	sum, any := 0.0, false
	for _, m := range mf.GetMetric() {
		l := map[string]float64{}
		for _, lp := range m.GetLabel() {
			if v, err := strconv.ParseFloat(lp.GetValue(), 64); err == nil && v > 0 && !math.IsInf(v, 0) {
				l[lp.GetName()] = v
			}
		}
		if v, ok := l["kv_cache_size_tokens"]; ok {
			sum, any = sum+v, true
		} else if b, n := l["block_size"], l["num_gpu_blocks"]; b > 0 && n > 0 {
			sum, any = sum+b*n, true
		}
	}
	if !any {
		return math.NaN()
	}
	return sum
}
