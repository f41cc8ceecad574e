package sse

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/sse/ssetest"
)

// ndjsonFiles reads the recorded NDJSON streams: ollama v0.17.4's
// /api/generate and /api/chat, captured with curl from the real engine of
// scripts/real-engine.sh (tiny-plain and tiny-thinking models).
func ndjsonFiles(t testing.TB) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob("testdata/*.ndjson")
	require.NoError(t, err)
	require.Len(t, names, 3)
	files := make(map[string][]byte, len(names))
	for _, name := range names {
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		files[filepath.Base(name)] = b
	}
	return files
}

// splitLines runs in through l in pieces of n bytes and returns copies of
// the lines and their ranges.
func splitLines(t testing.TB, l *Lines, in []byte, n int) (lines []string, ranges [][2]int64, tooLarge int) {
	t.Helper()
	var ev Event
	for len(in) > 0 {
		k := min(n, len(in))
		l.Feed(in[:k])
		in = in[k:]
		for {
			ok, err := l.Next(&ev)
			if err == ErrEventTooLarge {
				tooLarge++
				continue
			}
			require.NoError(t, err)
			if !ok {
				break
			}
			require.Nil(t, ev.Type)
			require.Nil(t, ev.ID)
			require.EqualValues(t, -1, ev.Retry)
			lines = append(lines, string(ev.Data))
			ranges = append(ranges, [2]int64{ev.Offset, int64(ev.Len)})
		}
	}
	return lines, ranges, tooLarge
}

func TestLinesSplitAnywhere(t *testing.T) {
	for name, b := range ndjsonFiles(t) {
		want := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		for _, in := range [][]byte{b, bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))} {
			for _, n := range []int{len(in), 4096, 100, 7, 1} {
				l := NewLines(0)
				got, ranges, _ := splitLines(t, l, in, n)
				require.Equal(t, want, got, "%s in pieces of %d", name, n)
				require.Zero(t, l.Pending(), name)
				// The ranges tile the stream.
				var off int64
				for _, r := range ranges {
					require.Equal(t, off, r[0])
					off += r[1]
				}
				require.EqualValues(t, len(in), off)
			}
		}
	}
}

func TestLinesBlankPartialAndTooLarge(t *testing.T) {
	in := []byte("\n{\"a\":1}\n  \n\r\n{\"b\":2}\r\n" + strings.Repeat("x", 40) + "\n{\"c\":3}\n{\"d\"")
	for _, n := range []int{len(in), 5, 1} {
		l := NewLines(16)
		got, ranges, tooLarge := splitLines(t, l, in, n)
		require.Equal(t, []string{`{"a":1}`, `{"b":2}`, `{"c":3}`}, got, n)
		require.Equal(t, 1, tooLarge, n)
		require.Equal(t, [2]int64{0, 9}, ranges[0]) // the leading blank line joins the first range
		require.Equal(t, 4, l.Pending(), "a last line cut before its LF is pending")
		l.Reset()
		require.Zero(t, l.Pending())
	}
	// A line that grows too large and never ends is pending.
	l := NewLines(4)
	_, _, tooLarge := splitLines(t, l, []byte("0123456789"), 3)
	require.Equal(t, 1, tooLarge)
	require.NotZero(t, l.Pending())
}

func TestClassifyOllama(t *testing.T) {
	for _, tt := range []struct{ data, want string }{
		{`{"model":"m","created_at":"t","response":" the","done":false}`, "content"},
		{`{"model":"m","response":"","thinking":"hm","done":false}`, "reasoning"},
		{`{"model":"m","response":"","done":false}`, "0"},
		{`{"model":"m","message":{"role":"assistant","content":"hi"},"done":false}`, "role|content"},
		{`{"model":"m","message":{"role":"assistant","content":"","thinking":" the"},"done":false}`, "role|reasoning"},
		{`{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"index":0,"name":"get_weather","arguments":{"city":"Paris"}}}]},"done":false}`, "role|tool_call"},
		{`{"model":"m","response":"","tool_calls":[{"function":{"name":"f","arguments":{}}}],"done":false}`, "tool_call"},
		{`{"model":"m","response":"","done":true,"done_reason":"stop","context":[1,2,3],"total_duration":380147534,"load_duration":366371051,"prompt_eval_count":29,"prompt_eval_duration":5111028,"eval_count":6,"eval_duration":4293224}`, "finish|usage|done|timing"},
		{`{"model":"m","created_at":"t","done":true,"done_reason":"load"}`, "finish|done"},
		{`{"model":"m","response":"x","done":"true"}`, "content"},
		{`{"error":"model runner has unexpectedly stopped"}`, "error"},
		{`{"model":"m","created_at":"t"}`, "unparsed"},
		{`{"response":"x","done":fals`, "unparsed"},
	} {
		var c Chunk
		Classify(ProtocolOllama, &Event{Data: []byte(tt.data)}, &c)
		require.Equal(t, tt.want, c.Flags.String(), tt.data)
	}
	var c Chunk
	Classify(ProtocolOllama, &Event{Data: []byte(`{"response":"","done":true,"done_reason":"stop","total_duration":380147534,"load_duration":366371051,"prompt_eval_count":29,"prompt_eval_duration":5111028,"eval_count":6,"eval_duration":4293224}`)}, &c)
	require.Equal(t, Usage{PromptTokens: 29, CompletionTokens: 6, CachedTokens: -1, ReasoningTokens: -1}, c.Usage)
	want := UnknownTiming()
	want.TotalMs, want.LoadMs, want.PrefillMs, want.DecodeMs = 380.147534, 366.371051, 5.111028, 4.293224
	require.Equal(t, want, c.Timing)
	// The whole non-stream body of /api/chat, as ollama answers "stream": false.
	ClassifyBody(ProtocolOllama, []byte(`{"model":"tiny-plain","created_at":"2026-12-01T18:39:45.222517877Z","message":{"role":"assistant","content":" next the"},"done":true,"done_reason":"stop","total_duration":27118881,"load_duration":3674993,"prompt_eval_count":25,"prompt_eval_duration":654849,"eval_count":45,"eval_duration":15708497}`), &c)
	require.Equal(t, "role|content|finish|usage|done|timing", c.Flags.String())
	require.Equal(t, Usage{PromptTokens: 25, CompletionTokens: 45, CachedTokens: -1, ReasoningTokens: -1}, c.Usage)
	require.Equal(t, "ollama", ProtocolOllama.String())
}

// TestOllamaRecordedStreams reads each recorded stream as the relay does:
// every line before the last is output and nothing else, the last ends
// it with usage and timings.
func TestOllamaRecordedStreams(t *testing.T) {
	for name, b := range ndjsonFiles(t) {
		l := NewLines(0)
		l.Feed(b)
		var ev Event
		var c Chunk
		var lines []Flags
		u, tm := UnknownUsage(), UnknownTiming()
		for {
			ok, err := l.Next(&ev)
			require.NoError(t, err)
			if !ok {
				break
			}
			Classify(ProtocolOllama, &ev, &c)
			lines = append(lines, c.Flags)
			u.Merge(c.Usage)
			tm.Merge(c.Timing)
		}
		output := FlagContent
		if strings.Contains(name, "thinking") {
			output = FlagReasoning
		}
		for i, f := range lines[:len(lines)-1] {
			require.Equal(t, output, f&^FlagRole, "%s line %d", name, i)
		}
		require.Equal(t, FlagFinish|FlagDone|FlagUsage|FlagTiming, lines[len(lines)-1]&^FlagRole, name)
		require.Positive(t, u.PromptTokens, name)
		// ollama counts the end-of-sequence step it never sends: one more
		// than the output lines (each of one token here).
		require.EqualValues(t, len(lines), u.CompletionTokens, name)
		require.Positive(t, tm.TotalMs, name)
		require.Positive(t, tm.PrefillMs, name)
		require.Positive(t, tm.DecodeMs, name)
		require.Less(t, tm.LoadMs+tm.PrefillMs+tm.DecodeMs, tm.TotalMs, name)
	}
}

// FuzzLines holds Lines, fed in pieces, to a plain split of the whole
// input on LF, each line over the limit squeezed byte by byte
// (squeezeRef): the same lines, the same drops, the same pending tail;
// every squeezed line is its received line with the contents of some
// arrays of numbers left out, within the limit.
func FuzzLines(f *testing.F) {
	for _, b := range ndjsonFiles(f) {
		f.Add(b, uint8(7))
	}
	f.Add([]byte("a\r\n\n  \nbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\nc"), uint8(3))
	f.Add([]byte(`{"done":true,"context":[`+strings.Repeat("123,", 40)+`9],"eval_count":2}`+"\n"), uint8(5))
	f.Add([]byte(`{"a":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25],"b":"`+strings.Repeat("x", 40)+`"}`+"\n"), uint8(9))
	f.Add([]byte(`{"a":["`+strings.Repeat("1,", 40)+`"],"b":1}`+"\n"), uint8(2))
	f.Fuzz(func(t *testing.T, in []byte, piece uint8) {
		const limit = 64
		n := int(piece%32) + 1
		var want []string
		drops := 0
		parts := bytes.Split(in, []byte("\n"))
		for _, p := range parts[:len(parts)-1] {
			line, ok := p, true
			if len(p) > limit {
				var dropped, inArray bool
				line, dropped, inArray = squeezeRef(p, limit)
				ok = !dropped && !inArray
				if ok {
					require.True(t, squeezedFrom(line, p), "%q from %q", line, p)
				}
			}
			switch line = bytes.TrimSuffix(line, []byte("\r")); {
			case !ok:
				drops++
			case len(bytes.TrimSpace(line)) > 0:
				want = append(want, string(line))
			}
		}
		tail := parts[len(parts)-1]
		if _, dropped, _ := squeezeRef(tail, limit); dropped {
			drops++ // dropped before its end; one inside an array is not yet
		}
		l := NewLines(limit)
		got, ranges, tooLarge := splitLines(t, l, in, n)
		require.Equal(t, want, got)
		require.Equal(t, drops, tooLarge)
		require.Equal(t, len(tail), l.Pending())
		var off int64
		for _, r := range ranges {
			require.Equal(t, off, r[0])
			off += r[1]
		}
	})
}

// squeezeRef is Lines' rule for a line over the limit, applied one byte at
// a time: when the kept bytes are full and another comes, the contents of
// the last array of numbers are left out (the one open at the end, whose
// remaining contents are then skipped up to its ']', else the last closed
// one); the line is dropped when there is none to empty or a skipped byte
// is not part of a number list. inArray says p ends inside an array being
// skipped (a line that ends there is dropped too: it is not JSON).
func squeezeRef(p []byte, limit int) (out []byte, dropped, inArray bool) {
	isNum := func(c byte) bool { return strings.IndexByte("0123456789+-.eE, \t\r", c) >= 0 }
	elide := false
	for _, c := range p {
		if elide {
			switch {
			case c == ']':
				out, elide = append(out, c), false
			case !isNum(c):
				return nil, true, false
			}
			continue
		}
		if len(out) == limit {
			i := len(out)
			for i > 0 && isNum(out[i-1]) {
				i--
			}
			if i > 0 && out[i-1] == '[' && i < len(out) {
				out, elide = out[:i], true
				if c == ']' {
					out, elide = append(out, c), false
				} else if !isNum(c) {
					return nil, true, false
				}
				continue
			}
			j := bytes.LastIndexByte(out, ']')
			if j < 0 {
				return nil, true, false
			}
			i = j
			for i > 0 && isNum(out[i-1]) {
				i--
			}
			if i == 0 || out[i-1] != '[' || i == j {
				return nil, true, false
			}
			out = append(out[:i:i], out[j:]...)
		}
		out = append(out, c)
	}
	return out, false, elide
}

// squeezedFrom reports whether out is p with the contents of some of its
// bracketed runs of number bytes left out ("[1,2]" as "[]").
func squeezedFrom(out, p []byte) bool {
	i := 0
	for j := 0; j < len(out); j++ {
		if i >= len(p) || p[i] != out[j] {
			return false
		}
		i++
		if out[j] == '[' && j+1 < len(out) && out[j+1] == ']' {
			for i < len(p) && strings.IndexByte("0123456789+-.eE, \t\r", p[i]) >= 0 {
				i++
			}
		}
	}
	return i == len(p)
}

// TestLinesSqueeze: a line over the limit whose excess is an array of
// numbers (ollama's "context") comes out with that array empty, in
// pieces of any size, its range the line as received; one whose excess is
// anything else, or that ends inside the array, is dropped once.
func TestLinesSqueeze(t *testing.T) {
	ids := strings.Repeat("128000,", 30) + "2"
	for _, tc := range []struct{ name, line, want string }{
		{"open at the limit", `{"done":true,"context":[` + ids + `],"total_duration":5,"eval_count":2}`,
			`{"done":true,"context":[],"total_duration":5,"eval_count":2}`},
		{"closed before the limit", `{"context":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21],"total_duration":` + strings.Repeat("9", 30) + `}`,
			`{"context":[],"total_duration":` + strings.Repeat("9", 30) + `}`},
		{"blanks and signs", `{"v":[ -1.5e3 , +2, ` + strings.Repeat("0.25, ", 20) + `7 ], "done":true}`, `{"v":[], "done":true}`},
		{"strings", `{"context":["` + strings.Repeat("1,", 40) + `"],"done":true}`, ""},
		{"no array", `{"response":"` + strings.Repeat("x", 80) + `","done":true}`, ""},
		{"still too long", `{"context":[1,2,3],"response":"` + strings.Repeat("x", 80) + `"}`, ""},
		{"cut in the array", `{"context":[` + ids, ""},
	} {
		in := []byte("{\"a\":1}\n" + tc.line + "\r\n{\"b\":2}\n")
		for _, n := range []int{len(in), 64, 7, 1} {
			l := NewLines(64)
			got, ranges, tooLarge := splitLines(t, l, in, n)
			if tc.want == "" {
				require.Equal(t, []string{`{"a":1}`, `{"b":2}`}, got, "%s, pieces of %d", tc.name, n)
				require.Equal(t, 1, tooLarge, tc.name)
				require.EqualValues(t, len(tc.line)+2+8, ranges[1][1], "%s: the dropped line joins the next range", tc.name)
				continue
			}
			require.Equal(t, []string{`{"a":1}`, tc.want, `{"b":2}`}, got, "%s, pieces of %d", tc.name, n)
			require.Zero(t, tooLarge, tc.name)
			require.Equal(t, [2]int64{8, int64(len(tc.line) + 2)}, ranges[1], "%s: the line as received", tc.name)
			require.Zero(t, l.Pending())
			require.LessOrEqual(t, cap(l.line), 2*64, "%s: the limit bounds the buffer", tc.name)
		}
	}
}

// TestLinesOllamaContext: the done line of /api/generate after ~200k tokens
// of conversation, 1.3 MiB of "context" before its counts and durations, at
// the default limit: read as the end, with usage and timings, in pieces as
// the relay reads them, with no allocation once the buffer has grown (the
// same stream again, not Reset: a Reset lets the grown buffer go, so a new
// stream with such a line grows it once more).
func TestLinesOllamaContext(t *testing.T) {
	in := ssetest.OllamaLongContext(200_000, 40)
	require.Greater(t, len(in), DefaultMaxEventBytes)
	read := func(l *Lines, n int) (Flags, Usage, Timing) {
		var ev Event
		var c Chunk
		var f Flags
		u, tm := UnknownUsage(), UnknownTiming()
		for rest := in; len(rest) > 0; {
			k := min(n, len(rest))
			l.Feed(rest[:k])
			rest = rest[k:]
			for {
				ok, err := l.Next(&ev)
				if err != nil {
					f |= FlagUnparsed
					continue
				}
				if !ok {
					break
				}
				Classify(ProtocolOllama, &ev, &c)
				f |= c.Flags
				u.Merge(c.Usage)
				tm.Merge(c.Timing)
			}
		}
		return f, u, tm
	}
	for _, n := range []int{len(in), 16 << 10, 4096} {
		l := NewLines(0)
		f, u, tm := read(l, n)
		require.Equal(t, "content|finish|usage|done|timing", f.String(), "pieces of %d", n)
		require.EqualValues(t, 200000, u.PromptTokens)
		require.EqualValues(t, 40, u.CompletionTokens)
		require.Equal(t, 345.678901, tm.PrefillMs)
		require.Equal(t, 912.345678, tm.TotalMs)
		require.Zero(t, l.Pending())
		require.Zero(t, testing.AllocsPerRun(5, func() { read(l, n) }), "pieces of %d", n)
		require.LessOrEqual(t, cap(l.line), 2*DefaultMaxEventBytes)
		l.Reset()
		require.LessOrEqual(t, cap(l.line), keptBytes)
	}
}

// TestLinesFlush: a last line without its LF comes out at Flush, with the
// rest of the stream's range; trailing blanks and a dropped line do not,
// and after Flush nothing is pending.
func TestLinesFlush(t *testing.T) {
	var ev Event
	l := NewLines(64)
	l.Feed([]byte("{\"a\":1}\n{\"b\":"))
	ok, err := l.Next(&ev)
	require.NoError(t, err)
	require.True(t, ok)
	ok, _ = l.Next(&ev)
	require.False(t, ok)
	l.Feed([]byte("2}\r"))
	ok, _ = l.Next(&ev)
	require.False(t, ok)
	require.True(t, l.Flush(&ev))
	require.Equal(t, `{"b":2}`, string(ev.Data))
	require.Equal(t, int64(8), ev.Offset)
	require.Equal(t, 8, ev.Len)
	require.Zero(t, l.Pending())

	blank := NewLines(64)
	blank.Feed([]byte("{\"a\":1}\n  "))
	_, _ = blank.Next(&ev)
	_, _ = blank.Next(&ev)
	require.False(t, blank.Flush(&ev))
	require.Zero(t, blank.Pending(), "trailing blanks are no cut line")

	big := NewLines(4)
	big.Feed([]byte("{\"toolong\":1}"))
	_, err = big.Next(&ev)
	require.ErrorIs(t, err, ErrEventTooLarge)
	require.False(t, big.Flush(&ev))
	require.NotZero(t, big.Pending(), "a dropped last line is still a cut")
}
