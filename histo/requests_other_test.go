package histo

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// TestRequestsListsEveryRouteWithConversation checks /requests: a request
// that is not inference is listed with route, method, path and status and
// null phases; an inference request carries its conversation and turn.
func TestRequestsListsEveryRouteWithConversation(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	probe := chat()
	probe.ID, probe.Route, probe.Method, probe.Path, probe.Status = 8, proxy.RouteOther, "GET", "/v1/v1/models", 404
	probe.FirstEvent, probe.FirstOutput, probe.FirstContent, probe.LastToken = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	probe.PromptTokens, probe.CompletionTokens, probe.CachedTokens, probe.ReasoningTokens = -1, -1, -1, -1
	turn := chat()
	turn.ID, turn.Path = 9, "/v1/chat/completions"
	turn.Prefix.Tracked, turn.Prefix.ConversationID, turn.Prefix.Turn = true, 0xabc, 3
	untracked := chat()
	untracked.ID = 10
	for _, tr := range []proxy.Trace{probe, turn, untracked} {
		r.Record(&tr)
	}

	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/requests", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	var got struct{ Requests []map[string]any }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Len(t, got.Requests, 3)
	byID := map[float64]map[string]any{}
	for _, rq := range got.Requests {
		byID[rq["id"].(float64)] = rq
	}

	p := byID[8]
	require.Equal(t, "other", p["route"])
	require.Equal(t, "GET", p["method"])
	require.Equal(t, "/v1/v1/models", p["path"])
	require.EqualValues(t, 404, p["status"])
	require.Equal(t, true, p["failed"])
	require.EqualValues(t, -1, p["request_index"])
	require.EqualValues(t, 2300, p["e2e_ms"])
	for _, k := range []string{"conversation", "turn", "ttft_ms", "time_to_first_output_ms", "prompt_tokens", "retry_attempt", "queue_ms"} {
		require.Contains(t, p, k)
		require.Nil(t, p[k], k)
	}

	c := byID[9]
	require.Equal(t, "0000000000000abc", c["conversation"])
	require.EqualValues(t, 3, c["turn"])
	require.Equal(t, "/v1/chat/completions", c["path"])
	require.EqualValues(t, 0, c["request_index"])

	u := byID[10]
	require.Nil(t, u["conversation"])
	require.Nil(t, u["turn"])

	// The records round-trip, for "anvilproxy top".
	var typed struct{ Requests []Request }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &typed))
	require.Equal(t, ConvID(0xabc), typed.Requests[1].Conversation)
	require.Equal(t, Count(3), typed.Requests[1].Turn)
	require.Equal(t, ConvID(0), typed.Requests[0].Conversation)
}
