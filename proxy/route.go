package proxy

import (
	"bytes"
	"sync"

	"github.com/anvilproxy/anvilproxy/sse"
)

// Route is the bounded kind of a request path, usable as a metric label.
type Route uint8

// Routes the proxy knows. Everything else is RouteOther and is forwarded
// verbatim and counted, not parsed (docs/design.md "Protocols and tokens").
const (
	RouteOther Route = iota
	RouteChat
	RouteCompletions
	RouteResponses
	RouteMessages
	RouteModels
	RouteEmbeddings
	RouteHealth
	RouteMetrics
	RouteLlamaCompletion // llama.cpp's native /completion and /completions (docs/engines.md)
	RouteOllamaGenerate  // ollama's native /api/generate (NDJSON; docs/engines.md)
	RouteOllamaChat      // ollama's native /api/chat (NDJSON; docs/engines.md)
)

var routeNames = [...]string{"other", "chat", "completions", "responses", "messages", "models", "embeddings", "health", "metrics",
	"llama_completion", "ollama_generate", "ollama_chat"}

// Routes lists every route, for pre-resolving metric label children.
var Routes = []Route{RouteOther, RouteChat, RouteCompletions, RouteResponses, RouteMessages, RouteModels, RouteEmbeddings, RouteHealth,
	RouteMetrics, RouteLlamaCompletion, RouteOllamaGenerate, RouteOllamaChat}

func (r Route) String() string {
	if int(r) < len(routeNames) {
		return routeNames[r]
	}
	return "other"
}

// Protocol is the protocol spoken on the route, for the SSE classifier and
// the prefix tracker (the one mapping from routes to protocols).
func (r Route) Protocol() sse.Protocol {
	switch r {
	case RouteChat:
		return sse.ProtocolChat
	case RouteCompletions:
		return sse.ProtocolCompletions
	case RouteResponses:
		return sse.ProtocolResponses
	case RouteMessages:
		return sse.ProtocolMessages
	case RouteLlamaCompletion:
		return sse.ProtocolLlama
	case RouteOllamaGenerate, RouteOllamaChat:
		return sse.ProtocolOllama
	}
	return sse.ProtocolUnknown
}

// Generates reports whether the route carries generation, in a protocol
// the proxy parses: the requests whose phases mean something. It is the one
// answer to "is this an inference request"; the other routes are counted,
// not split.
func (r Route) Generates() bool { return r.Protocol() != sse.ProtocolUnknown }

// RouteNamed is the route whose String is name, and whether there is one.
func RouteNamed(name string) (Route, bool) {
	for _, r := range Routes {
		if r.String() == name {
			return r, true
		}
	}
	return RouteOther, false
}

// routeOf maps a request path (without query) to its Route. A prefix before
// /v1 is tolerated so that gateways mounting the API under a path still match.
// llama.cpp serves its native completion protocol at /completion and at
// /completions, and OpenAI's at /v1/completions: a /completions not under
// /v1 is the native one. Its classifier also reads the OpenAI shape, so a
// gateway that serves OpenAI completions without /v1 is still measured,
// under the other route label (docs/engines.md, "Which route is which").
// ollama's native routes are /api/generate and /api/chat.
func routeOf(path []byte) Route {
	switch {
	case bytes.HasSuffix(path, []byte("/api/generate")):
		return RouteOllamaGenerate
	case bytes.HasSuffix(path, []byte("/api/chat")):
		return RouteOllamaChat
	case bytes.HasSuffix(path, []byte("/chat/completions")):
		return RouteChat
	case bytes.HasSuffix(path, []byte("/v1/completions")):
		return RouteCompletions
	case bytes.HasSuffix(path, []byte("/completions")), bytes.HasSuffix(path, []byte("/completion")):
		return RouteLlamaCompletion
	case bytes.HasSuffix(path, []byte("/responses")):
		return RouteResponses
	case bytes.HasSuffix(path, []byte("/messages")):
		return RouteMessages
	case bytes.HasSuffix(path, []byte("/models")):
		return RouteModels
	case bytes.HasSuffix(path, []byte("/embeddings")):
		return RouteEmbeddings
	case bytes.Equal(path, []byte("/health")), bytes.Equal(path, []byte("/healthz")), bytes.Equal(path, []byte("/ready")):
		return RouteHealth
	case bytes.Equal(path, []byte("/metrics")):
		return RouteMetrics
	}
	return RouteOther
}

var methodNames = []string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}

// methodOf returns the method as one of a fixed set of strings, so that a
// client-chosen method never becomes a free-form label.
func methodOf(m []byte) string {
	for _, s := range methodNames {
		if string(m) == s {
			return s
		}
	}
	return "OTHER"
}

// ModelOther is the label of every model beyond the allowed or learned set.
const ModelOther = "other"

// modelSet bounds the model label (RELIABILITY.md M1: a model label
// taken verbatim from request bodies lets a client create unbounded series).
// It is safe for concurrent use.
type modelSet struct {
	mu      sync.Mutex
	known   map[string]string // interned names
	fixed   bool              // an allowlist was configured: learn nothing
	maxSize int
}

func newModelSet(allow []string, max int) *modelSet {
	s := &modelSet{known: make(map[string]string), fixed: len(allow) > 0, maxSize: max}
	for _, m := range allow {
		s.known[m] = m
	}
	return s
}

// label returns the bounded label for a model name taken from a request.
func (s *modelSet) label(name []byte) string {
	if len(name) == 0 {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.known[string(name)]; ok {
		return m
	}
	if s.fixed || len(s.known) >= s.maxSize || len(name) > 128 {
		return ModelOther
	}
	m := string(name)
	s.known[m] = m
	return m
}
