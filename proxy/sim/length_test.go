package sim

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDrawLength checks the drawn lengths against the reference run's
// distribution: its range, and its quantiles interpolated.
func TestDrawLength(t *testing.T) {
	rng := uint64(42)
	const n = 20000
	draws := make([]int, n)
	sum := 0
	for i := range draws {
		draws[i] = drawLength(ReferenceLengths, &rng)
		sum += draws[i]
	}
	slices.Sort(draws)
	require.Equal(t, 274, draws[0])
	require.LessOrEqual(t, draws[n-1], 519)
	require.GreaterOrEqual(t, draws[n-1], 515, "the longest reference answer is reachable")
	mean := float64(sum) / n
	q := func(p float64) int { return draws[int(p*n)] }
	t.Logf("mean %.1f, p25 %d, p50 %d, p75 %d (reference run: mean 380.5, p25 281, p50 321, p75 455 of 6 samples)",
		mean, q(0.25), q(0.5), q(0.75))
	// The interpolated quantile function of the six samples: mean 377.3,
	// p25 = 281+0.25·40 = 291, p50 = 321+0.5·112 = 377, p75 = 433+0.75·22 = 449.5.
	require.InDelta(t, 377.3, mean, 3)
	require.InDelta(t, 291, q(0.25), 4)
	require.InDelta(t, 377, q(0.5), 6)
	require.InDelta(t, 449.5, q(0.75), 4)

	again := uint64(42)
	require.Equal(t, drawLength(ReferenceLengths, &again), drawLength(ReferenceLengths, ptr(uint64(42))), "deterministic")
	require.Equal(t, 300, drawLength([]int{300}, &rng))
}

func ptr[T any](v T) *T { return &v }

// finishOf is a non-stream answer's finish and completion tokens, per protocol.
type finishOf struct {
	reason string
	tokens int
}

// protocolCase builds a request on one route and reads its finish.
type protocolCase struct {
	path  string
	body  func(prompt string, limit int) map[string]any // limit 0: none set
	read  func(t *testing.T, resp *http.Response) finishOf
	stop  string // the natural finish
	limit string // the finish when the limit cuts the answer
}

var protocolCases = []protocolCase{
	{"/v1/chat/completions", func(p string, l int) map[string]any {
		return withLimit(map[string]any{"messages": []any{map[string]any{"role": "user", "content": p}}}, "max_tokens", l)
	}, readOpenAI, "stop", "length"},
	{"/v1/completions", func(p string, l int) map[string]any {
		return withLimit(map[string]any{"prompt": p}, "max_tokens", l)
	}, readOpenAI, "stop", "length"},
	{"/v1/messages", func(p string, l int) map[string]any {
		return withLimit(map[string]any{"messages": []any{map[string]any{"role": "user", "content": p}}}, "max_tokens", l)
	}, func(t *testing.T, resp *http.Response) finishOf {
		b := decodeBody[struct {
			StopReason string `json:"stop_reason"`
			Usage      struct {
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		}](t, resp)
		return finishOf{b.StopReason, b.Usage.OutputTokens}
	}, "end_turn", "max_tokens"},
	{"/v1/responses", func(p string, l int) map[string]any {
		return withLimit(map[string]any{"input": p}, "max_output_tokens", l)
	}, func(t *testing.T, resp *http.Response) finishOf {
		b := decodeBody[testRespObject](t, resp)
		return finishOf{b.Status, b.Usage.OutputTokens}
	}, "completed", "completed"}, // the sim's Responses always complete
}

func withLimit(m map[string]any, key string, limit int) map[string]any {
	if limit > 0 {
		m[key] = limit
	}
	return m
}

func readOpenAI(t *testing.T, resp *http.Response) finishOf {
	c := decodeBody[testChunk](t, resp)
	return finishOf{*c.Choices[0].FinishReason, c.Usage.CompletionTokens}
}

func (pc protocolCase) ask(t *testing.T, url, prompt string, limit int, headers ...string) finishOf {
	t.Helper()
	resp := post(t, context.Background(), url+pc.path, pc.body(prompt, limit), headers...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return pc.read(t, resp)
}

// TestNaturalStops: with an agent's large limit, every answer ends by itself
// at a length in the reference range, drawn per prompt; a smaller limit
// cuts exactly the answers longer than it.
func TestNaturalStops(t *testing.T) {
	cfg := fast()
	cfg.NaturalLengths = nil // the reference lengths
	cfg.DecodeTokensPerSec = 1e5
	_, ts := start(t, cfg)
	for _, pc := range protocolCases {
		t.Run(pc.path, func(t *testing.T) {
			var lengths []int
			cut, whole := 0, 0
			for i := range 30 {
				prompt := fmt.Sprintf("turn %d of a conversation", i)
				natural := pc.ask(t, ts.URL, prompt, 8192)
				require.Equal(t, pc.stop, natural.reason)
				require.GreaterOrEqual(t, natural.tokens, 274)
				require.LessOrEqual(t, natural.tokens, 519)
				lengths = append(lengths, natural.tokens)

				require.Equal(t, natural, pc.ask(t, ts.URL, prompt, 0), "no limit: the same natural stop")
				require.Equal(t, natural, pc.ask(t, ts.URL, prompt, 8192), "deterministic per prompt")

				limited := pc.ask(t, ts.URL, prompt, 350)
				if natural.tokens > 350 {
					require.Equal(t, finishOf{pc.limit, 350}, limited, "the limit cuts a longer answer")
					cut++
				} else {
					require.Equal(t, natural, limited, "a shorter answer is not affected by the limit")
					whole++
				}
			}
			require.Positive(t, cut)
			require.Positive(t, whole)
			slices.Sort(lengths)
			require.Greater(t, len(slices.Compact(lengths)), 15, "lengths vary between prompts")
		})
	}
}

// TestNaturalStopsStream checks the natural finish where a streaming client
// reads it: the final chunk, message_delta, response.completed.
func TestNaturalStopsStream(t *testing.T) {
	cfg := fast()
	cfg.NaturalLengths = []int{40}
	_, ts := start(t, cfg)
	for _, tc := range []struct {
		path, want string
	}{
		{"/v1/chat/completions", `"finish_reason":"stop"`},
		{"/v1/completions", `"finish_reason":"stop"`},
		{"/v1/messages", `"stop_reason":"end_turn"`},
		{"/v1/responses", `"status":"completed"`},
	} {
		pc := protocolCases[slices.IndexFunc(protocolCases, func(p protocolCase) bool { return p.path == tc.path })]
		body := pc.body("hello", 8192)
		body["stream"] = true
		resp := post(t, context.Background(), ts.URL+tc.path, body)
		evs, err := readAll(resp.Body)
		require.NoError(t, err)
		var all strings.Builder
		for _, ev := range evs {
			all.WriteString(ev.data)
		}
		require.Contains(t, all.String(), tc.want, tc.path)
		require.NotContains(t, all.String(), `"length"`, tc.path)
		require.NotContains(t, all.String(), `"max_tokens"`, tc.path)
	}
}

func TestCompletionTokensKnob(t *testing.T) {
	_, ts := start(t, fast())
	chat := protocolCases[0]
	require.Equal(t, finishOf{"stop", 7}, chat.ask(t, ts.URL, "x", 8192, "X-Sim-Completion-Tokens", "7"))
	require.Equal(t, finishOf{"stop", 7}, chat.ask(t, ts.URL, "x", 7, "X-Sim-Completion-Tokens", "7"), "the limit reached by a natural stop")
	require.Equal(t, finishOf{"length", 20}, chat.ask(t, ts.URL, "x", 20, "X-Sim-Completion-Tokens", "50"))
	require.Equal(t, finishOf{"stop", 500}, chat.ask(t, ts.URL, "x", 0, "X-Sim-Completion-Tokens", "500"))
}

// TestExactLength is the simulator before natural stops: the answer is the
// limit, or DefaultMaxTokens.
func TestExactLength(t *testing.T) {
	cfg := fast()
	cfg.ExactLength = true
	cfg.DefaultMaxTokens = 30
	_, ts := start(t, cfg)
	for _, pc := range protocolCases {
		require.Equal(t, finishOf{pc.limit, 1000}, pc.ask(t, ts.URL, "x", 1000), pc.path)
		require.Equal(t, finishOf{pc.stop, 30}, pc.ask(t, ts.URL, "x", 0), pc.path)
		require.Equal(t, finishOf{pc.stop, 9}, pc.ask(t, ts.URL, "x", 1000, "X-Sim-Completion-Tokens", "9"), pc.path)
	}
}
