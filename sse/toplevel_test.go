package sse

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// topLevelReference is TopLevelString the slow, obvious way: decode the
// object with encoding/json, keys compared exactly, the last repeat
// winning. ok is false when encoding/json cannot read b as an object.
func topLevelReference(b []byte, key string) (val string, isString, ok bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil || m == nil { // null decodes into a map, as none
		return "", false, false
	}
	v, found := m[key]
	if !found || len(v) == 0 || v[0] != '"' {
		return "", false, true
	}
	if json.Unmarshal(v, &val) != nil {
		return "", false, false
	}
	return val, true, true
}

var topLevelSeeds = []string{
	`{"model":"qwen3-8b","messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":"user","content":"{\"model\":\"inner\"}"}],"model":"outer"}`,
	`{"model":"a","model":"b"}`,
	`{"model":"a","model":7}`,
	`{"model":null}`,
	`{"Model":"case"}`,
	`{"mod\u0065l":"escaped key"}`,
	`{"model":"line\nbreak"}`,
	`{"model":"caf\u00e9"}`,
	`{"model":"café"}`,
	`{"nested":{"model":"no"},"list":[{"model":"no"}]}`,
	` { "model" : "spaced" } `,
	`{"model":"unterminated`,
	`{"model":"x",`,
	`[{"model":"array"}]`,
	`{}`,
	`{"a":"\\","model":"after backslash"}`,
	`{"a":"\"","model":"after quote"}`,
}

// TestTopLevelString pins the cases a model label depends on.
func TestTopLevelString(t *testing.T) {
	cases := []struct {
		in, want string
		res      int
	}{
		{`{"model":"qwen3-8b","stream":true}`, "qwen3-8b", KeyFound},
		{`{"messages":[{"content":"{\"model\":\"inner\"}","model":"inner"}],"model":"outer"}`, "outer", KeyFound},
		{`{"model":"a","model":"b"}`, "b", KeyFound},
		{`{"model":"a","model":7}`, "", KeyAbsent},
		{`{"model":null}`, "", KeyAbsent},
		{`{"Model":"case"}`, "", KeyAbsent},
		{`{"model":"caf\u00e9"}`, `caf\u00e9`, KeyFound}, // raw: the caller decodes escapes
		{`{"mod\u0065l":"x"}`, "", KeyUnknown},
		{`{"model":"x"`, "", KeyUnknown},
		{`["model","x"]`, "", KeyUnknown},
		{`{"a":"\\","model":"m"}`, "m", KeyFound},
	}
	for _, c := range cases {
		raw, res := TopLevelString([]byte(c.in), "model")
		require.Equal(t, c.res, res, c.in)
		require.Equal(t, c.want, string(raw), c.in)
	}
}

// TestTopLevelStringSkipsLargeBodies: the key after a large nested value
// is found, and the scan does not allocate.
func TestTopLevelStringSkipsLargeBodies(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat(`say \"hi\" {[`, 10000) + `"}],"model":"last"}`)
	var raw []byte
	allocs := testing.AllocsPerRun(10, func() { raw, _ = TopLevelString(body, "model") })
	require.Equal(t, "last", string(raw))
	require.Zero(t, allocs)
}

// requireTopLevel checks TopLevelString against encoding/json wherever
// encoding/json reads the input: the same string found (once its escapes
// are decoded), or the same absence. Where encoding/json refuses the input
// the scan may answer anything but must not panic. FuzzScanner runs it.
func requireTopLevel(t *testing.T, b []byte) {
	raw, res := TopLevelString(b, "model")
	want, isString, ok := topLevelReference(b, "model")
	if !ok {
		return
	}
	switch res {
	case KeyFound:
		require.True(t, isString, "found a string where encoding/json has none: %q", b)
		var got string
		require.NoError(t, json.Unmarshal([]byte(`"`+string(raw)+`"`), &got), "raw %q", raw)
		require.Equal(t, want, got, "input %q", b)
	case KeyAbsent:
		require.False(t, isString, "missed %q in %q", want, b)
	case KeyUnknown:
		// Allowed only for an escaped key: valid objects scan.
		require.Contains(t, string(b), `\`, "a valid object without escapes left unknown: %q", b)
	}
}
