package main

import (
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// misdirected answers an inference request that came to the admin
// listener: an agent given the admin port as its base URL. A bare 404
// made Claude Code blame "the selected model"; this answer is an error
// object in both the OpenAI shape (error.message, type, code) and the
// Anthropic one (type "error"), so that either SDK prints the message,
// which names the data port. 421 Misdirected Request, not 404: the path
// exists, on the other listener. A warning is logged at most once per
// hintEvery. Safe for concurrent use.
type misdirected struct {
	dataURL string // the agents' base URL, …/v1
	log     *zap.Logger
	warned  atomic.Int64 // unix ns of the last warning
}

func newMisdirected(st *stack, log *zap.Logger) *misdirected {
	return &misdirected{dataURL: localURL(st.ln.Addr().String()) + "/v1", log: log}
}

// misdirectedPaths are the routes on the admin listener that belong to
// the data listener: every OpenAI- and Anthropic-style API path.
var misdirectedPaths = []string{"/v1/", "/chat/completions", "/completions", "/responses", "/messages", "/models"}

func (m *misdirected) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	msg := "this is anvilproxy's admin listener (dashboard, /metrics, /status); inference requests go to the proxy listener: use " +
		m.dataURL + " as the base URL (Anthropic clients: without /v1)"
	body := map[string]any{
		"type": "error",
		"error": map[string]any{
			"message": msg, "type": "invalid_request_error", "code": "wrong_port", "param": nil,
		},
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusMisdirectedRequest)
	_ = json.NewEncoder(w).Encode(body)
	m.warn(r.URL.Path)
}

// warn logs the misdirection once per hintEvery.
func (m *misdirected) warn(path string) {
	now := time.Now().UnixNano()
	last := m.warned.Load()
	if now-last < int64(hintEvery) || !m.warned.CompareAndSwap(last, now) {
		return
	}
	m.log.Warn("an inference request came to the admin listener: point the agent at the proxy listener",
		zap.String("path", boundedPath(path)), zap.String("base_url", m.dataURL))
}

// boundedPath keeps a logged path short: it is the client's.
func boundedPath(p string) string {
	if len(p) > 64 {
		return p[:64] + "…"
	}
	return p
}
