package bench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEventRoundTrip(t *testing.T) {
	for _, size := range []int{0, MinEventBytes, MinEventBytes + 1, 256, 1000} {
		ev := eventTemplate(size)
		require.Len(t, ev, max(size, MinEventBytes))
		for _, c := range []struct {
			seq uint64
			t   int64
		}{{0, 0}, {7, 1234567890}, {9_999_999_999, 1<<63 - 1}} {
			stampEvent(ev, c.seq, c.t)
			seq, sent, err := parseEvent(ev, size)
			require.NoError(t, err)
			require.Equal(t, c.seq, seq)
			require.Equal(t, c.t, sent)
		}
	}
}

// TestEventIsOpenAIChunk: the proxy under test must see a real chat chunk
// with content, or it would measure a different path.
func TestEventIsOpenAIChunk(t *testing.T) {
	ev := eventTemplate(256)
	stampEvent(ev, 42, 99)
	data, ok := strings.CutPrefix(string(ev), "data: ")
	require.True(t, ok)
	require.True(t, strings.HasSuffix(data, "\n\n"))
	var chunk struct {
		Object  string `json:"object"`
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(data)), &chunk))
	require.Equal(t, "chat.completion.chunk", chunk.Object)
	require.True(t, strings.HasPrefix(chunk.Choices[0].Delta.Content, "0000000042 00000000000000000099 "))

	fin := string(appendFinish(nil, 5))
	first, rest, ok := strings.Cut(fin, "\n\n")
	require.True(t, ok)
	require.True(t, json.Valid([]byte(strings.TrimPrefix(first, "data: "))), first)
	require.Equal(t, doneEvent, rest)
}

func TestParseEventRejects(t *testing.T) {
	good := eventTemplate(256)
	stampEvent(good, 3, 5)
	cases := map[string][]byte{
		"short":         good[:len(good)-1],
		"long":          append(append([]byte(nil), good...), 'x'),
		"digit changed": []byte(strings.Replace(string(good), "0000000003", "000000000a", 1)),
		"pad changed":   []byte(strings.Replace(string(good), "xxxx", "xyxx", 1)),
		"other event":   []byte(doneEvent),
		"prefix":        []byte(strings.Replace(string(good), "anvilbench", "anvilbenck", 1)),
	}
	for name, ev := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := parseEvent(ev, 256)
			require.ErrorIs(t, err, errEventFormat)
		})
	}
}

func TestRequestBodies(t *testing.T) {
	s := appendStreamRequest(nil, 40, 5*time.Millisecond, 3, 17)
	require.True(t, json.Valid(s), string(s))
	require.Equal(t, int64(40), intField(s, `"max_tokens":`))
	require.Equal(t, int64(5000), intField(s, `"bench_gap_us":`))
	require.Contains(t, string(s), `"stream":true`)
	require.Contains(t, string(s), "bench request 3-17")

	small := appendSmallRequest(nil, 1, 2)
	require.True(t, json.Valid(small), string(small))
	require.NotContains(t, string(small), `"stream":true`)
	require.Equal(t, int64(-1), intField(small, `"bench_gap_us":`))
	require.True(t, json.Valid([]byte(smallResponse)))
}

func TestIntField(t *testing.T) {
	require.Equal(t, int64(12), intField([]byte(`{"a":12}`), `"a":`))
	require.Equal(t, int64(-1), intField([]byte(`{"a":x}`), `"a":`))
	require.Equal(t, int64(-1), intField([]byte(`{"b":1}`), `"a":`))
	require.Equal(t, int64(0), intField([]byte(`{"a":0}`), `"a":`))
}
