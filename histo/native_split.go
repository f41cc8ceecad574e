package histo

import "github.com/anvilproxy/anvilproxy/proxy"

// wholeSplit is the split of an answer the engine sent whole, which has no
// first output to split at, from the engine's own durations
// (docs/engines.md). Its reported prefill is the prefill, as on a stream
// (source server_prefill), and what its time leaves before the prefill
// is the queue:
//
//   - ollama's native "stream": false: total_duration runs from its
//     handler's start to the done object, of which eval_duration is the
//     decoding after the first token, so the queue is total − prompt_eval
//     − eval: the stream's "rest of the time to first output" (load, slot
//     wait, tokenizing, the batch in progress) with the gaps between
//     decode batches added;
//   - llama.cpp (no total): timings.prompt_ms and predicted_ms are the wall
//     time from the slot's prompt start to the first token and from there
//     to the end, so the queue is the upstream time the proxy saw less both
//     (with the final answer's own serializing).
//
// The queue is bounded by the upstream time less prefill and decode. ok is
// false for a stream or when the prefill or decode is missing (TGI's and
// vLLM's whole answers report their queue, split before this).
func wholeSplit(tr *proxy.Trace) (split, bool) {
	if tr.Stream || tr.ServerPrefill < 0 || tr.ServerDecode < 0 || tr.End.IsZero() {
		return split{}, false
	}
	pq, _ := tr.ProxyQueue()
	upstream := tr.End.Sub(tr.Recv) - pq - tr.Connect
	total := tr.ServerTotal
	if total < 0 {
		total = upstream
	}
	most := max(0, upstream-tr.ServerPrefill-tr.ServerDecode)
	queue := min(max(0, total-tr.ServerPrefill-tr.ServerDecode), most)
	return split{Queue: pq + queue, Prefill: tr.ServerPrefill, Source: SourceServerPrefill, OK: true}, true
}
