package dist

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMergeExact: two Dists merge to what recording every value in one
// gives; one without a readable histogram makes the percentiles unknown
// but still counts.
func TestMergeExact(t *testing.T) {
	var a, b, all Rec
	for i := range 1000 {
		v := float64(i) * 0.37
		all.Record(Ms, v)
		if i%3 == 0 {
			a.Record(Ms, v)
		} else {
			b.Record(Ms, v)
		}
	}
	require.Equal(t, all.Dist(Ms), Merge(Ms, a.Dist(Ms), b.Dist(Ms)))
	broken := b.Dist(Ms)
	broken.HDR = "not an histogram"
	m := Merge(Ms, a.Dist(Ms), broken)
	require.Equal(t, int64(1000), m.Count)
	require.False(t, m.P50.Known())
	empty := Rec{}
	require.True(t, empty.Empty())
	require.False(t, empty.Dist(Share).P99.Known(), "no samples: null, not 0")
}

func TestFloatJSON(t *testing.T) {
	b, err := json.Marshal([]Float{NaN, 1.5})
	require.NoError(t, err)
	require.Equal(t, "[null,1.5]", string(b))
	var back []Float
	require.NoError(t, json.Unmarshal(b, &back))
	require.False(t, back[0].Known())
	require.Equal(t, Float(1.5), back[1])
}

func TestMergeSections(t *testing.T) {
	one := &struct{ n int }{1}
	combine := func(in []*struct{ n int }) *struct{ n int } {
		out := &struct{ n int }{}
		for _, s := range in {
			out.n += s.n
		}
		return out
	}
	require.Nil(t, MergeSections(nil, combine))
	require.Same(t, one, MergeSections([]*struct{ n int }{nil, one}, combine))
	require.Equal(t, 2, MergeSections([]*struct{ n int }{one, nil, one}, combine).n)
}

// TestNearestRank: ceil(p/100·n) in integers, at least 1.
func TestNearestRank(t *testing.T) {
	require.Equal(t, int64(19), Rank(95, 20), "0.95·20 is 19, not 20")
	require.Equal(t, int64(1), Rank(0, 5))
	require.Equal(t, int64(1), Rank(50, 1))
	require.Equal(t, int64(5), Rank(50, 10))
	require.Equal(t, int64(10), Rank(99, 10))
	v := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.Equal(t, 5, NearestRank(v, 50))
	require.Equal(t, 9, NearestRank(v, 90))
	require.Equal(t, 10, NearestRank(v, 99))
}

func TestMaxMinIgnoreUnknown(t *testing.T) {
	for _, c := range []struct{ a, b, max, min Float }{
		{1, 2, 2, 1},
		{2, 1, 2, 1},
		{NaN, 3, 3, 3},
		{3, NaN, 3, 3},
	} {
		require.Equal(t, c.max, Max(c.a, c.b), "Max(%v, %v)", c.a, c.b)
		require.Equal(t, c.min, Min(c.a, c.b), "Min(%v, %v)", c.a, c.b)
	}
	require.False(t, Max(NaN, NaN).Known())
	require.False(t, Min(NaN, NaN).Known())
}

func TestAddCounts(t *testing.T) {
	dst := map[string]int64{"a": 1}
	AddCounts(dst, map[string]int64{"a": 2, "b": 5})
	AddCounts(dst, nil)
	require.Equal(t, map[string]int64{"a": 3, "b": 5}, dst)
}
