package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo/snapshot"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// simSnapshots serves n chats through a stack in front of a simulated
// engine decoding at decode tokens/s and returns the directory of its
// final snapshot.
func simSnapshots(t *testing.T, n int, decode float64) string {
	t.Helper()
	dir := t.TempDir()
	st, _ := startStackFor(t, "sim", func(f *serveFlags) {
		f.sim = sim.Config{PrefillTokensPerSec: 1e6, DecodeTokensPerSec: decode}
		f.snapshot = snapshot.Config{Dir: dir, Interval: time.Hour}
	})
	for range n {
		st.chat(t)
	}
	require.NoError(t, st.snaps.Close(context.Background()))
	return dir
}

// TestDiffCommand: "anvilproxy diff" on two runs of the simulated engine,
// the second decoding at a third of the speed: the table, the verdict
// naming decode, --fail-on's exit codes, --json and the usage errors.
func TestDiffCommand(t *testing.T) {
	base, cur := simSnapshots(t, 30, 3000), simSnapshots(t, 30, 1000)

	code, out, errOut := runCmd("diff", base, cur)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^tpot +p50 +30/30 +\S+ ms +\S+ ms +\+\S+ ms +\+\d+%$`, out)
	unwrapped := strings.ReplaceAll(out, "\n  ", " ") // the verdict is one line, wrapped at 100 columns
	require.Regexp(t, `(?m)^verdict: .*decode slower: the engine or its batch`, unwrapped)

	code, out, errOut = runCmd("diff", "--fail-on", "tpot.p50>+50%", "--fail-on", "tokens_s.p99<-20%", base, cur)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "fail-on tpot.p50>+50%: holds (change +")
	require.Contains(t, out, "fail-on tokens_s.p99<-20%: holds, but on too few samples (30 and 30; p99 needs 100): not failed")
	require.Contains(t, errOut, "1 of 2 --fail-on bounds held")

	code, _, errOut = runCmd("diff", "--fail-on", "tpot.p50>+500%", base, cur)
	require.Equal(t, 0, code, errOut)

	code, out, errOut = runCmd("diff", "--json", "--fail-on", "tpot.p50>+50%", base, cur+","+cur)
	require.Equal(t, 1, code, errOut)
	var doc struct {
		Rows []struct {
			Name   string
			Points []struct {
				Stat           string
				CurrentSamples int64 `json:"current_samples"`
			}
		}
		Verdict string
		FailOn  []struct {
			Expr  string
			Fails bool
		} `json:"fail_on"`
		Failed bool
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Len(t, doc.Rows, 10)
	require.Equal(t, "queue", doc.Rows[0].Name)
	require.Equal(t, int64(60), doc.Rows[0].Points[0].CurrentSamples, "a side of two directories merges both")
	require.True(t, doc.Failed)
	require.True(t, doc.FailOn[0].Fails)

	code, _, errOut = runCmd("diff", "--fail-on", "ttft.p95>10%", base, cur)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `--fail-on "ttft.p95>10%": want METRIC.STAT OP CHANGE`)
	code, _, errOut = runCmd("diff", base)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "want BASELINE and CURRENT")
	code, _, errOut = runCmd("diff", base, t.TempDir())
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "current: ")
}
