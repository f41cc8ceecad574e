package retry

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clusterKey hashes to few homes, so probe runs wrap and overlap and
// deletions must shift entries back.
type clusterKey uint32

func (k clusterKey) hash() uint64 { return uint64(k%5) * 0x9e3779b97f4a7c15 >> 60 }

// TestTableModel checks the table against a map plus an LRU slice under
// random adds, gets, touches and removes, through growth and eviction.
func TestTableModel(t *testing.T) {
	for _, budget := range []int64{1, 10 << 10} { // 64 nodes (evicting), then room to grow
		tb := newTable[clusterKey, int](budget)
		var order []clusterKey // least recently touched first
		model := map[clusterKey]int{}
		rng := rand.New(rand.NewPCG(1, uint64(budget)))
		for step := range 50_000 {
			k := clusterKey(rng.IntN(300))
			n := tb.get(k)
			_, ok := model[k]
			require.Equal(t, ok, n != nil, "step %d key %d", step, k)
			switch {
			case n == nil:
				n, evicted := tb.add(k, time.Duration(step))
				n.val = step
				if evicted {
					delete(model, order[0])
					order = order[1:]
				}
				model[k] = step
				order = append(order, k)
			case rng.IntN(2) == 0:
				require.Equal(t, model[k], n.val)
				tb.remove(n)
				delete(model, k)
				order = slices.DeleteFunc(order, func(x clusterKey) bool { return x == k })
			default:
				tb.touch(n, time.Duration(step))
				order = append(slices.DeleteFunc(order, func(x clusterKey) bool { return x == k }), k)
			}
			require.Equal(t, len(model), tb.len())
		}
		var got []clusterKey
		for n := tb.at(tb.tail); n != nil; n = tb.at(n.prev) {
			got = append(got, n.key)
		}
		require.Equal(t, order, got)
		require.LessOrEqual(t, cap(tb.nodes), max(tb.maxNodes, minNodes))
	}
}
