package sim

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// maxModelLen is the context length reported by /v1/models: the seed
// model's 262k.
const maxModelLen = 262144

func (s *Server) serveModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{
		ID:          s.cfg.Model,
		Object:      "model",
		Created:     time.Now().Unix(),
		OwnedBy:     "anvilproxy-sim",
		Root:        s.cfg.Model,
		MaxModelLen: maxModelLen,
	}}})
}

// serveHealth answers 200 with an empty body, as vLLM's /health does.
func serveHealth(w http.ResponseWriter, _ *http.Request) {}

// serveNotFound answers unknown paths as vLLM's FastAPI server does.
func serveNotFound(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
}

// serveMethodNotAllowed answers a known path with the wrong method, as
// vLLM's FastAPI server does.
func serveMethodNotAllowed(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
}

// serveMetrics writes the counters in the Prometheus text format, with the
// two vLLM gauges that dashboards use to tell queueing from running.
func (s *Server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	st := s.Stats()
	var b strings.Builder
	for _, m := range []struct {
		name, typ, help string
		v               int64
	}{
		{"sim_requests_total", "counter", "Generation requests received.", st.Requests},
		{"sim_requests_completed_total", "counter", "Generation requests answered in full.", st.Completed},
		{"sim_requests_aborted_total", "counter", "Generation requests whose client went away first.", st.Aborted},
		{"sim_requests_rejected_total", "counter", "Generation requests answered 429.", st.Rejected429},
		{"sim_requests_failed_total", "counter", "Generation requests answered another error or cut mid-stream.", st.Failed},
		{"sim_requests_truncated_total", "counter", "Streams ended cleanly without their final events.", st.Truncated},
		{"sim_prompt_tokens_total", "counter", "Prompt tokens of requests that reached prefill.", st.PromptTokens},
		{"sim_prompt_tokens_cached_total", "counter", "Prompt tokens served by the prefix cache.", st.CachedTokens},
		{"sim_generation_tokens_total", "counter", "Completion tokens generated.", st.CompletionTokens},
		{"sim_requests_running", "gauge", "Requests holding a slot.", int64(st.Active)},
		{"sim_requests_waiting", "gauge", "Requests waiting for a slot.", int64(st.Queued)},
		{"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", int64(st.Active)},
		{"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", int64(st.Queued)},
	} {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n%s %d\n", m.name, m.help, m.name, m.typ, m.name, m.v)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write([]byte(b.String())) // a failed write leaves nothing to do
}
