package retry

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoRawBytesExported: credentials, addresses, user agents and bodies
// never appear in anything the package hands out.
func TestNoRawBytesExported(t *testing.T) {
	tr, clk := newTest(t, Config{})
	r := Request{
		Auth:        []byte("Bearer sk-CANARY-123"),
		APIKey:      []byte("sk-ant-CANARY-123"),
		RemoteIP:    []byte("203.0.113.77"),
		UserAgent:   []byte("CANARY-AGENT/1.0"),
		Body:        []byte(`{"messages":[{"role":"user","content":"CANARY-BODY"}]}`),
		RetryHeader: -1,
	}
	var values []any
	for i := range 3 {
		r.RetryHeader = i
		res := tr.Begin(r)
		values = append(values, res)
		clk.advance(1e9)
		tr.End(&res, Outcome{ClientAbort: true, FirstTokenSeen: true, PromptTokens: 7, CompletionTokens: 3})
		values = append(values, res)
	}
	values = append(values, tr.Stats(), tr.TopClients(10), tr.TopClients(10)[0].ClientID)
	for _, v := range values {
		j, err := json.Marshal(v)
		require.NoError(t, err)
		for _, s := range []string{fmt.Sprintf("%+v", v), fmt.Sprintf("%#v", v), string(j)} {
			for _, canary := range []string{"CANARY", "203.0.113.77", "sk-"} {
				require.False(t, strings.Contains(s, canary), "%q in %s", canary, s)
			}
		}
	}
	require.Contains(t, string(must(json.Marshal(tr.Stats()))), `"client_abort_mid_stream":2`)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
