package sse

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// reference parses a whole stream the slow, obvious way, straight from
// WHATWG "Parsing an event stream" and "Interpreting an event stream", and
// renders the events like render. FuzzParser checks the Parser against it.
func reference(in []byte) []string {
	s := strings.TrimPrefix(string(in), "\xEF\xBB\xBF")
	var out []string
	var data, typ, id strings.Builder
	hasData, hasID, retry := false, false, int64(-1)
	for {
		i := strings.IndexAny(s, "\r\n")
		if i < 0 {
			return out // the rest is an unterminated line
		}
		line := s[:i]
		if strings.HasPrefix(s[i:], "\r\n") {
			s = s[i+2:]
		} else {
			s = s[i+1:]
		}
		if line == "" {
			if hasData {
				ev := Event{Type: []byte(typ.String()), Data: []byte(strings.TrimSuffix(data.String(), "\n")), Retry: retry}
				if hasID {
					ev.ID = []byte(id.String())
				}
				out = append(out, render(&ev))
			}
			data.Reset()
			typ.Reset()
			id.Reset()
			hasData, hasID, retry = false, false, -1
			continue
		}
		name, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch name {
		case "data":
			data.WriteString(value + "\n")
			hasData = true
		case "event":
			typ.Reset()
			typ.WriteString(value)
		case "id":
			if !strings.Contains(value, "\x00") {
				id.Reset()
				id.WriteString(value)
				hasID = true
			}
		case "retry":
			if value != "" && strings.Trim(value, "0123456789") == "" {
				n, err := strconv.ParseInt(value, 10, 64)
				if err != nil {
					n = math.MaxInt64
				}
				retry = n
			}
		}
	}
}

func FuzzParser(f *testing.F) {
	for _, tt := range whatwgTests {
		f.Add([]byte(tt.in), uint(len(tt.in)/2))
	}
	f.Add([]byte("data: a\r\n\r\ndata: b\r\n\r\n"), uint(10))
	f.Add([]byte("\xEF\xBB\xBFdata: x\r"), uint(2))
	f.Add([]byte("data: 0123456789012345678901234567890123456789\n\ndata: ok\n\n"), uint(20))
	f.Fuzz(func(t *testing.T, in []byte, k uint) {
		k %= uint(len(in)) + 1
		requireSplitInvariant(t, in, int(k), 0)
		requireSplitInvariant(t, in, int(k), 32)

		whole := parse(0, in)
		require.Equal(t, reference(in), whole.out)
		single := parse(0, bytewise(in)...)
		require.Equal(t, whole.out, single.out)
		requireTiles(t, single.spans, len(in)-single.pending)
	})
}

func FuzzClassify(f *testing.F) {
	for _, in := range streamFiles(f) {
		p := NewParser(0)
		p.Feed(in)
		var ev Event
		for ok, _ := p.Next(&ev); ok; ok, _ = p.Next(&ev) {
			f.Add(string(ev.Type), append([]byte(nil), ev.Data...))
		}
	}
	f.Add("", []byte(`{"choices":[{"delta":{"content":"\\\"\u00e9"}}],"usage":{"prompt_tokens":1e400}}`))
	f.Add("error", []byte(`{"type":"message_start","message":{"message":{"content":[[[{}]]]}}}`))
	f.Add("", []byte(`{"content":"\u00e9","stop":true,"tokens_evaluated":1e400,"timings":{"cache_n":-1,"prompt_n":"8"}}`))
	f.Add("", []byte(`{"stop":tr,"content":"x"}`))
	f.Fuzz(func(t *testing.T, typ string, data []byte) {
		const output = FlagRole | FlagReasoning | FlagContent | FlagToolCall | FlagFinish | FlagUsage | FlagTiming
		ev := Event{Type: []byte(typ), Data: data}
		var c Chunk
		for proto := ProtocolUnknown; proto < numProtocols; proto++ {
			Classify(proto, &ev, &c)
			if c.Flags&FlagUnparsed != 0 {
				require.Zero(t, c.Flags&output, "%v: unparsed data with flags %v", proto, c.Flags)
				require.Equal(t, UnknownUsage(), c.Usage)
			}
			ClassifyBody(proto, data, &c)
			if c.Flags&FlagUnparsed != 0 {
				require.Equal(t, FlagUnparsed, c.Flags, "%v", proto)
			}
		}
	})
}
