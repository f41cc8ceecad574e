package snapshot

import (
	"net/http"

	"github.com/anvilproxy/anvilproxy/histo"
)

// The last complete window. Right after a rotation the current window is
// empty ("0 requests" a second after a busy minute), so /snapshot can also
// serve the window that just ended: ?window=last. The Writer keeps that
// window (its records included: one window more in memory at most) until
// the next rotation replaces it.

// keep makes win the last window and returns it.
func (w *Writer) keep(win *histo.Window) *histo.Window {
	w.last.Store(&queued{w: win, pm: prefillModel(w.src)})
	return win
}

// Handler serves the current window of the Writer's Source as a v1
// document, as the package's Handler does; with ?window=last, the last
// window that ended (404 before the first has). ?window=current is the
// default. Safe for concurrent use.
func (w *Writer) Handler() http.Handler {
	current := Handler(w.src)
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		switch req.URL.Query().Get("window") {
		case "", "current":
			current.ServeHTTP(rw, req)
			return
		case "last":
		default:
			http.Error(rw, `window must be "current" or "last"`, http.StatusBadRequest)
			return
		}
		q := w.last.Load()
		if q == nil {
			http.Error(rw, "no window has ended yet", http.StatusNotFound)
			return
		}
		doc, err := Build(q.w, q.pm)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return
		}
		histo.ServeJSON(rw, doc, true)
	})
}
