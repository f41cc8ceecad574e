package conformance

import (
	"bytes"
	"regexp"
	"testing"
)

// Seeded ollama is deterministic: the same request twice gives the same
// bytes except the ids it draws and the clock it reads. mask blanks those.
var (
	maskIDs   = regexp.MustCompile(`"((?:[a-z]+_)?id)":"[^"]*"`)
	maskClock = regexp.MustCompile(`"(created|created_at|completed_at)":[0-9]+`)
)

func mask(b []byte) []byte {
	b = maskIDs.ReplaceAll(b, []byte(`"$1":"…"`))
	return maskClock.ReplaceAll(b, []byte(`"$1":0`))
}

// TestBodiesIdenticalDirectVsProxied: on every route, streamed and not,
// the body through the proxy is byte for byte the body the engine sends a
// client directly (after masking ids and clocks).
func TestBodiesIdenticalDirectVsProxied(t *testing.T) {
	st := newStack(t)
	cases := []struct {
		name, path, body string
	}{
		{"chat-unary", "/v1/chat/completions", `{"model":"` + plainModel + `","messages":[{"role":"user","content":"one body, two paths"}]}`},
		{"messages-unary", "/v1/messages", `{"model":"` + plainModel + `","max_tokens":512,"messages":[{"role":"user","content":"one body, two paths"}]}`},
	}
	for _, rt := range routes {
		cases = append(cases, struct{ name, path, body string }{rt.name, rt.path, rt.body(plainModel, "")})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			direct := do(t, st.engine, c.path, c.body, "", 0)
			proxied := do(t, st.proxyURL, c.path, c.body, "", 0)
			sameBody(t, direct, proxied)
		})
	}
}

// sameBody fails unless both responses are 200 with equal masked bodies.
func sameBody(t *testing.T, direct, proxied *response) {
	t.Helper()
	if direct.status != 200 || proxied.status != 200 || direct.readErr != nil || proxied.readErr != nil {
		t.Fatalf("direct %d (%v), proxied %d (%v)", direct.status, direct.readErr, proxied.status, proxied.readErr)
	}
	if len(direct.body) == 0 {
		t.Fatal("empty body")
	}
	d, p := mask(direct.body), mask(proxied.body)
	if !bytes.Equal(d, p) {
		i := 0
		for i < len(d) && i < len(p) && d[i] == p[i] {
			i++
		}
		// Report where, not what: bodies hold completion text.
		t.Fatalf("bodies differ at byte %d of %d (direct) / %d (proxied)", i, len(d), len(p))
	}
	if ct, pct := direct.header.Get("Content-Type"), proxied.header.Get("Content-Type"); ct != pct {
		t.Errorf("Content-Type direct %q, proxied %q", ct, pct)
	}
	t.Logf("%d bytes, identical after masking ids and clocks", len(d))
}
