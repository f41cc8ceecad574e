package snapshot

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
)

// TestSnapshotLastWindow: ?window=last serves the window that just ended
// while the current one is empty; before any has ended it is a 404. In a
// bubble the first rotation comes exactly one interval after Start.
func TestSnapshotLastWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, clk := newRecorder(t, histo.Config{})
		w, _ := newWriter(t, Config{Interval: 20 * time.Millisecond}, r)
		h := w.Handler()
		get := func(query string) (int, *Document) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/snapshot"+query, nil))
			if rec.Code != http.StatusOK {
				return rec.Code, nil
			}
			var doc Document
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &doc))
			return rec.Code, &doc
		}
		code, _ := get("?window=last")
		require.Equal(t, http.StatusNotFound, code)
		code, _ = get("?window=nope")
		require.Equal(t, http.StatusBadRequest, code)

		record(r, 0, 7, 0)
		clk.t = t0.Add(30 * time.Second)
		w.Start()
		t.Cleanup(func() { _ = w.Close(context.Background()) }) // a failure must not leave the bubble blocked
		time.Sleep(20*time.Millisecond - time.Nanosecond)
		synctest.Wait()
		code, _ = get("?window=last")
		require.Equal(t, http.StatusNotFound, code, "no window has ended yet")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		code, doc := get("?window=last")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, int64(7), doc.Requests)
		_, cur := get("")
		require.Zero(t, cur.Requests)
		// The clock stands still: later rotations end empty windows at the same
		// instant, and "last" follows them.
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		require.NoError(t, w.Close(context.Background()))
		_, cur = get("")
		require.Zero(t, cur.Requests)
		_, last := get("?window=last")
		require.Zero(t, last.Requests)
		_, cur = get("?window=current")
		require.Zero(t, cur.Requests)
	})
}
