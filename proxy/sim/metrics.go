package sim

import (
	"net/http"
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
