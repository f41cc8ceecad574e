package histo

import "github.com/anvilproxy/anvilproxy/proxy"

// wholeSplit is the split of an answer the engine sent whole, which has no
// first output to split at: ollama's native "stream": false (docs/engines.md,
// ollama). Its durations place the first token inside the engine's own
// time: total_duration runs from its handler's start to the done object,
// of which eval_duration is the decoding after the first token and
// prompt_eval_duration the prefill, so the engine queue is
// total − prompt_eval − eval: the streamed route's "rest of the time to
// first output" (load, slot wait, tokenizing, the batch in progress)
// with the gaps between decode batches added. It is bounded by what the
// proxy saw: at most the upstream's whole time less the prefill and
// decode. ok is false for a stream or when any of the three is missing
// (llama.cpp's and TGI's whole answers report no total).
func wholeSplit(tr *proxy.Trace) (split, bool) {
	if tr.Stream || tr.ServerPrefill < 0 || tr.ServerDecode < 0 || tr.ServerTotal < 0 || tr.End.IsZero() {
		return split{}, false
	}
	pq, _ := tr.ProxyQueue()
	upstream := tr.End.Sub(tr.Recv) - pq - tr.Connect
	most := max(0, upstream-tr.ServerPrefill-tr.ServerDecode)
	queue := min(max(0, tr.ServerTotal-tr.ServerPrefill-tr.ServerDecode), most)
	return split{Queue: pq + queue, Prefill: tr.ServerPrefill, Source: SourceServerPrefill, OK: true}, true
}
