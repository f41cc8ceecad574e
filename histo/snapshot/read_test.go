package snapshot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadReference(t *testing.T) {
	doc, err := Read(referenceFile)
	require.NoError(t, err)
	require.Equal(t, int64(6), doc.Requests)
	require.Len(t, doc.RequestTimings, 6)
	require.Equal(t, int64(1791200544279383700), doc.StartedAtUnixNs, "nanoseconds survive")
	rt := doc.RequestTimings[0]
	require.False(t, rt.QueueMs.Known(), "a key the benchmark lacks is unknown, not 0")
	require.Equal(t, int64(-1), int64(rt.CachedTokens))
	require.Equal(t, 1418.298299999151, float64(rt.TtftMs))
}

func TestReadBadInput(t *testing.T) {
	dir := t.TempDir()
	ref := readReference(t)
	tests := []struct {
		name, content, want string
	}{
		{"empty.json", "", "empty file"},
		{"text.json", "hello", "not JSON"},
		{"truncated.json", string(ref[:len(ref)/2]), "truncated JSON"},
		{"trailing.json", `{"schema":"x"} {}`, "not JSON"},
		{"array.json", `[1,2]`, "not a v1 document"},
		{"noschema.json", `{"metrics":{}}`, `no "schema" key`},
		{"schema.json", `{"schema":"anvil-serving.benchmark/v2"}`, `schema is "anvil-serving.benchmark/v2"`},
		{"incomplete.json", `{"schema":"anvil-serving.benchmark/v1","metrics":{}}`, "incomplete v1 document"},
		{"types.json", strings.Replace(string(ref), `"prompt_tokens": 62327`, `"prompt_tokens": "many"`, 1), "malformed v1 document"},
		{"histogram.json", `{"schema":"anvil-serving.benchmark/v1","metrics":{},"request_timings":[],"started_at_unix_ns":1,"finished_at_unix_ns":2,` +
			`"anvilproxy":{"histograms":{"ttft":{"unit":"us","hdr":"garbage"}}}}`, "histogram ttft"},
	}
	for _, tt := range tests {
		path := filepath.Join(dir, tt.name)
		require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o644))
		_, err := Read(path)
		require.ErrorContains(t, err, tt.want, tt.name)
		require.True(t, strings.HasPrefix(err.Error(), path+": "), "%s: %v names the file", tt.name, err)
		require.NotContains(t, err.Error(), "\n", tt.name)
	}
	_, err := Read(filepath.Join(dir, "missing.json"))
	require.ErrorContains(t, err, filepath.Join(dir, "missing.json"))
}

// FuzzDecode: Decode never panics, and a document it accepts merges and
// prints.
func FuzzDecode(f *testing.F) {
	ref, err := os.ReadFile(referenceFile)
	require.NoError(f, err)
	f.Add(ref)
	f.Add([]byte(`{"schema":"anvil-serving.benchmark/v1","metrics":{},"request_timings":[{}],"started_at_unix_ns":1,"finished_at_unix_ns":0}`))
	f.Add([]byte(`{"schema":"anvil-serving.benchmark/v1","metrics":{"prefix_cache_hit_avg":1},"request_timings":[],"failures":[1],"started_at_unix_ns":1,"finished_at_unix_ns":2,"anvilproxy":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := Decode(data)
		if err != nil {
			return
		}
		merged, err := Merge(doc, doc)
		if err != nil {
			return
		}
		var b strings.Builder
		require.NoError(t, WriteTable(&b, merged))
	})
}
