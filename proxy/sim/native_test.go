package sim

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

type nativeObject struct {
	Content         *string        `json:"content"`
	Stop            *bool          `json:"stop"`
	Choices         any            `json:"choices"`
	Usage           any            `json:"usage"`
	IDSlot          int            `json:"id_slot"`
	TokensPredicted int            `json:"tokens_predicted"`
	TokensEvaluated int            `json:"tokens_evaluated"`
	StopType        string         `json:"stop_type"`
	TokensCached    int            `json:"tokens_cached"`
	Timings         map[string]any `json:"timings"`
}

// TestNativeStream: llama.cpp's /completion stream is partial objects with
// "stop": false, then one final object with "stop": true, the counts and
// the timings, and nothing after it — no choices, usage or [DONE]. The
// final object leaves one decode step after the last token, with the slot.
func TestNativeStream(t *testing.T) {
	for _, tc := range []struct {
		path     string
		nPredict int
		tokens   int
		stopType string
	}{
		{"/completion", -1, 64, "eos"},
		{"/completions", 10, 10, "limit"},
	} {
		t.Run(tc.stopType, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fast()
				cfg.Engine = EngineLlamaCpp
				v := startVirtual(t, cfg)
				resp := v.post(t, context.Background(), tc.path,
					map[string]any{"prompt": strings.Repeat("p", 400), "n_predict": tc.nPredict, "stream": true},
					"X-Request-Id", "n", "X-Sim-Event-Gap", "5ms")
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Contains(t, resp.Header.Get("Content-Type"), "text/event-stream")
				evs, err := readAll(resp.Body)
				require.NoError(t, err)
				require.Greater(t, len(evs), 2)
				var text strings.Builder
				for _, ev := range evs[:len(evs)-1] {
					require.Empty(t, ev.name)
					o := decode[nativeObject](t, ev.data)
					require.False(t, *o.Stop)
					require.Nil(t, o.Choices)
					require.Nil(t, o.Timings)
					text.WriteString(*o.Content)
				}
				require.Equal(t, tc.tokens, words(text.String()))
				final := decode[nativeObject](t, evs[len(evs)-1].data)
				require.True(t, *final.Stop)
				require.Empty(t, *final.Content, "the text went out in the partial objects")
				require.Nil(t, final.Choices)
				require.Nil(t, final.Usage)
				require.Equal(t, tc.stopType, final.StopType)
				require.Equal(t, tc.tokens, final.TokensPredicted)

				tr := truthOf(t, v.s, "n")
				require.Equal(t, OutcomeCompleted, tr.Outcome)
				require.Equal(t, tr.PromptTokens, final.TokensEvaluated)
				require.Equal(t, tr.PromptTokens+tc.tokens, final.TokensCached)
				require.Equal(t, tr.Slot, final.IDSlot)
				require.Equal(t, float64(tc.tokens), final.Timings["predicted_n"])
				require.Equal(t, float64(tr.CachedTokens), final.Timings["cache_n"])
				require.Equal(t, float64(tr.PromptTokens-tr.CachedTokens), final.Timings["prompt_n"])
				require.Equal(t, evs[len(evs)-1].at, tr.Released)
				step := time.Duration(0)
				if tc.stopType == "eos" {
					step = 5 * time.Millisecond
				}
				require.Equal(t, step, evs[len(evs)-1].at.Sub(evs[len(evs)-2].at))
			})
		})
	}
}

// TestNativeWhole: a whole /completion answer is the final object with the
// whole content; a bad prompt is answered 400.
func TestNativeWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineLlamaCpp
		v := startVirtual(t, cfg)
		body := map[string]any{"prompt": []string{strings.Repeat("q", 400)}}
		first := decodeBody[nativeObject](t, v.post(t, context.Background(), "/completion", body))
		require.True(t, *first.Stop)
		require.Equal(t, 64, words(*first.Content))
		require.Equal(t, "eos", first.StopType)
		require.Zero(t, first.Timings["cache_n"])
		again := decodeBody[nativeObject](t, v.post(t, context.Background(), "/completion", body))
		require.Equal(t, float64((again.TokensEvaluated-1)/16*16), again.Timings["cache_n"], "the same prompt again, from the slot")

		resp := v.post(t, context.Background(), "/completion", map[string]any{"prompt": 7})
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})
}
