package sse

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// walk reads one value with the Scanner the way its readers do (the
// classifiers, TopLevelString, the prefix tracker's canonical text) and
// returns it in the shape encoding/json decodes into with UseNumber. Where
// the input is valid (strict), it also checks that Skip and the walk end
// at the same place, and that Str's raw string is what AppendString
// decoded. On malformed input it just has to end.
func walk(t *testing.T, s *Scanner, strict bool) any {
	skipped := *s
	skipped.Skip()
	v := walkValue(t, s, strict)
	if strict {
		require.False(t, s.Bad())
		require.Equal(t, skipped.Pos(), s.Pos(), "Skip and the walk end apart")
	}
	return v
}

func walkValue(t *testing.T, s *Scanner, strict bool) any {
	switch s.Peek() {
	case '{':
		require.True(t, s.Object())
		m := map[string]any{}
		for k := s.Key(); k != nil; k = s.Key() {
			key := NewScanner([]byte(`"` + string(k) + `"`))
			m[jsonText(key.AppendString(nil))] = walk(t, s, strict)
		}
		return m
	case '[':
		require.True(t, s.Array())
		l := []any{}
		for s.Elem() {
			l = append(l, walk(t, s, strict))
		}
		return l
	case '"':
		start, raw := s.Pos(), *s
		text := s.AppendString(nil)
		if strict {
			require.Equal(t, raw.Str(), s.Since(start)[1:s.Pos()-start-1])
		}
		return jsonText(text)
	}
	if s.Null() {
		return nil
	}
	switch lit := s.Scalar(); string(lit) {
	case "true":
		return true
	case "false":
		return false
	default:
		return json.Number(lit)
	}
}

// jsonText is decoded text as encoding/json returns it: each byte of
// invalid UTF-8 turned into U+FFFD, as converting to runes does.
// AppendString keeps the bytes, as the prefix tracker hashes them.
func jsonText(b []byte) string { return string([]rune(string(b))) }

var scannerSeeds = []string{
	`{"choices":[{"delta":{"content":"\\\"\u00e9"}}],"usage":{"prompt_tokens":1e400}}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9\ud83d\ude00\ud800x"}]}],"tools":[]}`,
	`[1,-0.5e+2,true,false,null,"",{},[],{"":""}]`,
	` { "a" : [ 1 , 2 ] , "b" : { "c" : null } } `,
	`"\b\f\n\r\t\/\\\""`,
	`{"a":tr@ue}`, `{"a":1"b":2}`, `[1{"a":1}]`, `{"a":[1}]}`, `nullx`, `"\u12"`,
	`{"a":"x""b":2}`, `[1,]`, `{"a":{1]}}`, "\x00\xff{", `{"a":"caf` + "\xc3" + `"}`,
}

// FuzzScanner checks the Scanner against encoding/json on every input
// encoding/json accepts: a walk with Object, Key, Elem, AppendString, Null
// and Scalar reads the same value (keys and strings decoded, numbers byte
// for byte), Skip ends where the walk ends, and the walk consumes the whole
// text without going Bad. TopLevelString is checked too (requireTopLevel).
// On any input the walk ends, without a panic, and Bad leaves the Scanner
// at the end.
func FuzzScanner(f *testing.F) {
	for _, s := range append(scannerSeeds, topLevelSeeds...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		requireTopLevel(t, b)
		valid := json.Valid(b)
		s := NewScanner(b)
		got := walk(t, &s, valid)
		if s.Bad() {
			require.False(t, valid, "valid JSON found bad: %q", b)
			require.Equal(t, len(b), s.Pos())
		}
		if !valid {
			return
		}
		require.Zero(t, s.Peek(), "the walk stopped short in %q", b)
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var want any
		require.NoError(t, d.Decode(&want))
		require.Equal(t, want, got, "input %q", b)
	})
}

// TestScannerMalformed pins inputs the Scanner refuses though both of its
// former copies let one of them through: a literal that runs into another
// token, and a value that does not end at a separator.
func TestScannerMalformed(t *testing.T) {
	for _, in := range []string{`{"a":tr@ue}`, `{"a":1"b":2}`, `[1{"a":1}]`, `[1}`, `{"a":"\x"}`, `{"a":"x`} {
		s := NewScanner([]byte(in))
		walk(t, &s, false)
		require.True(t, s.Bad(), in)
		require.Equal(t, len(in), s.Pos(), in)
	}
}

// TestAppendStringAllocs: decoding into a buffer with room does not
// allocate, whatever the escapes.
func TestAppendStringAllocs(t *testing.T) {
	in := []byte(`"` + strings.Repeat(`plain text, \"quoted\"\n\tcaf\u00e9 \ud83d\ude00 `, 100) + `"`)
	dst := make([]byte, 0, len(in))
	var out []byte
	allocs := testing.AllocsPerRun(20, func() {
		s := NewScanner(in)
		out = s.AppendString(dst[:0])
	})
	require.Zero(t, allocs)
	var want string
	require.NoError(t, json.Unmarshal(in, &want))
	require.Equal(t, want, string(out))
}
