package main

import (
	"net/http"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/snapshot"
)

// serve --baseline: the dashboard's comparison of the snapshot window in
// progress against a baseline given at start, as "anvilproxy diff" makes
// it (snapshot.Compare), served by the admin listener at /diff.

// loadBaseline reads and merges --baseline (files or directories, joined
// with commas, as a side of diff). An empty flag is no baseline.
func loadBaseline(arg string) (*snapshot.Document, error) {
	if arg == "" {
		return nil, nil
	}
	return readSide(arg)
}

// diffHandler serves the comparison of the window in progress against the
// baseline as JSON (the Diff of "anvilproxy diff --json"); 404 without a
// baseline, so that the dashboard leaves its panel out. The baseline is
// read-only after start; each request builds the current window's
// document. Safe for concurrent use.
func (st *stack) diffHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if st.baseline == nil {
			http.Error(w, "no --baseline given", http.StatusNotFound)
			return
		}
		cur, err := snapshot.BuildFrom(st.rec)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		d, err := snapshot.Compare(st.baseline, cur)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		histo.ServeJSON(w, d, false)
	})
}
