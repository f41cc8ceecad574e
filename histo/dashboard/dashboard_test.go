package dashboard

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestServes(t *testing.T) {
	mux := http.NewServeMux()
	Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, tc := range []struct{ path, typ, has string }{
		{"/", "text/html; charset=utf-8", `<script src="dashboard.js"`},
		{"/dashboard.js", "text/javascript; charset=utf-8", `getJSON("requests?limit=512")`},
		{"/dashboard.css", "text/css; charset=utf-8", "--prefill"},
	} {
		resp, err := http.Get(srv.URL + tc.path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, tc.path)
		require.Equal(t, tc.typ, resp.Header.Get("Content-Type"), tc.path)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "connect-src 'self'", tc.path)
		require.Contains(t, string(body), tc.has, tc.path)
	}
	for _, path := range []string{"/index.html", "/assets/dashboard.js", "/nope"} {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, path)
	}
}

// TestNoRequestOffTheMachine: the page names no absolute URL, so it loads
// and fetches only from the listener that served it, also behind a
// reverse proxy that mounts it under a path prefix (every reference is
// relative, none starts with "/").
func TestNoRequestOffTheMachine(t *testing.T) {
	ref := regexp.MustCompile(`(?:src|href)="([^"]*)"|url\(([^)]*)\)|getJSON\("([^"]*)"|fetch\(([^,)]*)`)
	n := 0
	require.NoError(t, fs.WalkDir(Assets(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(Assets(), path)
		require.NoError(t, err)
		text := string(b)
		for _, scheme := range []string{"http://", "https://", "ws://", "wss://", "//fonts", "@import"} {
			require.NotContains(t, text, scheme, path)
		}
		for _, m := range ref.FindAllStringSubmatch(text, -1) {
			u := strings.Join(m[1:], "")
			if u == "path" { // fetch(path): the argument of getJSON, checked above
				continue
			}
			n++
			require.False(t, strings.HasPrefix(u, "/") || strings.Contains(u, ":"), "%s: %q is not a relative URL", path, u)
		}
		return nil
	}))
	require.GreaterOrEqual(t, n, 6, "found the page's references")
}
