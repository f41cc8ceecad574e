package histo

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestServeJSON(t *testing.T) {
	rec := httptest.NewRecorder()
	ServeJSON(rec, map[string]int{"a": 1}, false)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"), "admin answers are live readings")
	require.Equal(t, "{\"a\":1}\n", rec.Body.String())

	rec = httptest.NewRecorder()
	ServeJSON(rec, map[string]int{"a": 1}, true)
	require.Equal(t, "{\n  \"a\": 1\n}\n", rec.Body.String())

	rec = httptest.NewRecorder()
	ServeJSON(rec, make(chan int), false) // cannot be encoded
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.NotEqual(t, "application/json", rec.Header().Get("Content-Type"))
}
