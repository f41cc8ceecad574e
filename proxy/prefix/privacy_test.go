package prefix

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/anvilproxy/anvilproxy/sse"
	"github.com/stretchr/testify/require"
)

// TestCanaryNeverExported puts a canary in every part of the prompt, makes
// every kind of drift happen around it, and checks that no exported value
// carries it, in JSON or fmt form; nor does the index.
func TestCanaryNeverExported(t *testing.T) {
	const canary = "CANARY-7f3a"
	tr := newTracker(t, Config{VolatileFields: []string{"id"}, VolatilePatterns: []string{`CANARY-\w+ \d+`}})
	c := newConv("Please handle " + canary + " in the parser, it crashes on input " + canary + ".")
	c.system = systemPrompt("2025-06-01T10:00:00Z") + "Secret: " + canary + "\n"
	c.tools = append(c.tools, tool("canary", canary))
	var results []Result
	for i := range 8 {
		if i > 0 {
			c.turn(i)
			c.msgs[len(c.msgs)-1].Content = fmt.Sprintf("output mentions %s %d", canary, i)
		}
		switch i {
		case 3:
			c.system = strings.Replace(c.system, "10:00", "10:03", 1)
		case 5:
			c.tools[0], c.tools[4] = c.tools[4], c.tools[0]
		case 6:
			c.msgs = c.msgs[3:]
		}
		r := tr.Observe(sse.ProtocolChat, c.body(t), t0)
		tr.Cache(&r, r.PromptBytes/4, 0)
		results = append(results, r)
	}
	require.NotEmpty(t, tr.RecentDrifts(0))
	exported := []any{results, tr.RecentDrifts(0), tr.Stats()}
	for _, v := range exported {
		j, err := json.Marshal(v)
		require.NoError(t, err)
		require.NotContains(t, string(j), canary)
		require.NotContains(t, fmt.Sprintf("%+v %#v", v, v), canary)
	}
	for _, f := range tr.ix.fps {
		require.False(t, bytes.Contains(f.sketch, []byte(canary)))
	}
}
