// Package dashboard serves the admin listener's live page: per-phase
// percentiles over time, a waterfall of recent requests, goodput against the
// SLO budget, prefix-cache hits, drift and retry amplification. The page is
// one HTML file with its script and style sheet, embedded in the binary and
// drawn by hand as inline SVG: no build step, no CDN, no web font, and
// every URL it fetches is relative (requests, snapshot on the same
// listener), so it works offline, behind a path-prefixing reverse proxy,
// and never makes a request off the machine.
package dashboard

import (
	"bytes"
	"embed"
	"io/fs"
	"net/http"
	"time"
)

//go:embed assets
var assets embed.FS

// Assets returns the page's files (index.html, dashboard.js,
// dashboard.css), for tests that inspect what the page may load.
func Assets() fs.FS {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic("BUG: dashboard: " + err.Error())
	}
	return sub
}

// files are the served paths and their content types; nothing else under
// the mux's "/" is the dashboard's.
var files = map[string]struct{ name, typ string }{
	"/":              {"index.html", "text/html; charset=utf-8"},
	"/dashboard.js":  {"dashboard.js", "text/javascript; charset=utf-8"},
	"/dashboard.css": {"dashboard.css", "text/css; charset=utf-8"},
}

// Register adds the page to mux: GET / and its two assets. Other paths
// stay 404. The Recorder's /requests and the snapshot handler's /snapshot,
// which the page reads, must be on the same mux.
func Register(mux *http.ServeMux) {
	h := Handler()
	mux.Handle("GET /{$}", h)
	mux.Handle("GET /dashboard.js", h)
	mux.Handle("GET /dashboard.css", h)
}

// Handler serves the page and its assets by path; any other path is 404.
// It is safe for concurrent use.
func Handler() http.Handler {
	type file struct {
		name, typ string
		body      []byte
	}
	served := make(map[string]file, len(files))
	for path, f := range files {
		b, err := fs.ReadFile(Assets(), f.name)
		if err != nil {
			panic("BUG: dashboard: " + err.Error())
		}
		served[path] = file{f.name, f.typ, b}
	}
	// Last-Modified is the process start: with no-cache, a browser
	// revalidates every load and gets a new page after a restart.
	start := time.Now()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := served[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", f.typ)
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		// The page loads only its own script and style and fetches only
		// its own listener: the policy says so to the browser too.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		http.ServeContent(w, r, f.name, start, bytes.NewReader(f.body))
	})
}
