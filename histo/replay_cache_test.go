package histo_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReplayInferredCache replays every captured agent run (8 concurrent
// conversations of 4 turns against ollama v0.17.4, 1 and 4 slots, quiet
// and loaded host) and holds the inferred cached tokens to ollama's own
// reuse (its slot log's used=N, in each capture's truth) as the live suite
// does (proxy/conformance/agents_test.go): known from each conversation's
// second turn, and within 20% of the engine's reuse over each conversation,
// on every conversation of the quiet runs and on all but a few of the
// loaded ones. Before session 19, one conversation in ten 4-slot runs read
// +32% to +44% (its first turn credited with the system prompt of a slot
// the engine had to spare): quiet runs 54 of 56, loaded 264 of 272; after
// it, all 96 quiet and 271 of 272 loaded. Session 20's first five live
// runs missed three more first turns (+34% to +37%): a cost model taught
// at the proxy's reuse before the head mode was known (earlyCached), and
// a proven slot count whose holders ended within the overlap tolerance of
// the turn's first output but too late to prefill it (ranFirst). Now all
// 184 quiet (the session's eleven runs added), and 270 of 272 loaded.
func TestReplayInferredCache(t *testing.T) {
	for _, c := range []struct {
		glob string
		bar  float64 // share of conversations within 20%
	}{
		{"testdata/ollama/agents-*.json", 1},
		{"testdata/ollama/loaded/agents-*.json", 0.99},
	} {
		files, err := filepath.Glob(c.glob)
		require.NoError(t, err)
		require.NotEmpty(t, files, c.glob)
		within, total := 0, 0
		for _, f := range files {
			w, n, line := replayCache(t, loadTimeline(t, f))
			within, total = within+w, total+n
			t.Logf("%s: %d of %d conversations within 20%%: %s", filepath.Base(f), w, n, line)
		}
		t.Logf("%s: %d of %d conversations within 20%% of ollama's reuse", c.glob, within, total)
		require.GreaterOrEqual(t, float64(within), c.bar*float64(total), "%s: %d of %d conversations within 20%%", c.glob, within, total)
	}
}

// replayCache replays tl and compares each conversation's inferred cached
// tokens, over its turns from the second on, with the engine's reuse.
func replayCache(t *testing.T, tl *replayTimeline) (within, total int, line string) {
	t.Helper()
	rec := replay(t, tl)
	inferred := map[uint64]int64{}
	for _, r := range rec.Recent(1 << 16) {
		inferred[r.ID] = int64(r.CacheInferredTokens)
	}
	used := map[uint64]int64{}
	for _, row := range tl.Truth {
		used[row.ID] = row.Used
	}
	type sums struct{ inf, used int64 }
	convs := map[uint64]*sums{}
	var order []uint64
	for i := range tl.Traces {
		tr := &tl.Traces[i]
		inf, ok := inferred[tr.ID]
		require.True(t, ok, "%s: request %d not recorded", tl.Name, tr.ID)
		if inf < 0 {
			require.Zero(t, tr.Prefix.Turn, "%s: request %d (turn %d) has no inferred figure", tl.Name, tr.ID, tr.Prefix.Turn+1)
			continue
		}
		id := tr.Prefix.ConversationID
		if convs[id] == nil {
			convs[id] = &sums{}
			order = append(order, id)
		}
		convs[id].inf += inf
		convs[id].used += used[tr.ID]
	}
	var rels []string
	for _, id := range order {
		s := convs[id]
		rel := float64(s.inf-s.used) / float64(max(s.used, 1))
		rels = append(rels, fmt.Sprintf("%+.0f%%", 100*rel))
		total++
		if rel >= -0.2 && rel <= 0.2 {
			within++
		}
	}
	return within, total, strings.Join(rels, " ")
}
