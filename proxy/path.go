package proxy

// Trace.Path is the one client string a Trace carries. It is kept, like an
// nginx access log keeps $uri, so that /requests can show which path a
// request that is not inference asked for (an agent's probe that got a 404
// is otherwise only a counter). What is kept is bounded and inert:
//
//   - the path only: never the query string (where API keys and tokens are
//     put, e.g. ?key=) nor the fragment; fasthttp's PathOriginal has neither;
//   - at most MaxPathBytes bytes, the cut marked with "...";
//   - printable ASCII only: every other byte is percent-encoded, so no
//     control character or invalid UTF-8 reaches a log or a terminal.
//
// It is never a metric label (Route is) and never written to a snapshot.

// MaxPathBytes bounds Trace.Path, before escaping.
const MaxPathBytes = 128

// knownPaths are the paths agents send on every request: they are kept as
// constants so that recording them does not allocate.
var knownPaths = []string{
	"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
	"/v1/models", "/v1/embeddings", "/health", "/healthz", "/metrics", "/",
}

// pathOf returns the bounded, escaped form of a request path (without its
// query string) for Trace.Path.
func pathOf(p []byte) string {
	for _, k := range knownPaths {
		if string(p) == k {
			return k
		}
	}
	cut := len(p) > MaxPathBytes
	if cut {
		p = p[:MaxPathBytes]
	}
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(p)+3)
	for _, c := range p {
		if c > ' ' && c < 0x7f { // printable ASCII, '%' of an escape included
			out = append(out, c)
			continue
		}
		out = append(out, '%', hex[c>>4], hex[c&15])
	}
	if cut {
		out = append(out, "..."...)
	}
	return string(out)
}
