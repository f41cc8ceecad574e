package lru

import (
	"container/list"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

type entry struct {
	Links[entry]
	key int
}

// order walks l from newest to oldest, checking the backward links on the
// way.
func order(t *testing.T, l *List[entry, *entry]) []int {
	var keys []int
	var newer *entry
	for e := l.Newest(); e != nil; e = l.Older(e) {
		require.Same(t, newer, e.newer, "backward link of %d", e.key)
		keys = append(keys, e.key)
		newer = e
	}
	require.Same(t, newer, l.Oldest())
	require.Len(t, keys, l.Len())
	return keys
}

func TestListOrder(t *testing.T) {
	var l List[entry, *entry]
	require.Nil(t, l.Newest())
	require.Nil(t, l.Oldest())
	a, b, c := &entry{key: 1}, &entry{key: 2}, &entry{key: 3}
	require.False(t, l.Contains(a))
	l.Remove(a) // not in the list: nothing happens
	require.Zero(t, l.Len())

	l.Touch(a)
	require.True(t, l.Contains(a), "a sole element is in the list")
	l.Touch(b)
	l.Touch(c)
	require.Equal(t, []int{3, 2, 1}, order(t, &l))
	l.Touch(a) // the oldest becomes the newest
	require.Equal(t, []int{1, 3, 2}, order(t, &l))
	l.Touch(a) // already the newest
	require.Equal(t, []int{1, 3, 2}, order(t, &l))
	l.Touch(c) // from the middle
	require.Equal(t, []int{3, 1, 2}, order(t, &l))
	l.Remove(a)
	require.False(t, l.Contains(a))
	require.Equal(t, []int{3, 2}, order(t, &l))
	l.Remove(b)
	l.Remove(c)
	require.Empty(t, order(t, &l))
	l.Touch(b) // an element may come back after it left
	require.Equal(t, []int{2}, order(t, &l))
}

// TestListAgainstContainerList drives a List and container/list with the
// same random operations and compares their orders after every one.
func TestListAgainstContainerList(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var l List[entry, *entry]
	ref := list.New()
	elems := make([]*entry, 16)
	refs := make([]*list.Element, len(elems))
	for i := range elems {
		elems[i] = &entry{key: i}
	}
	for range 20000 {
		i := rng.IntN(len(elems))
		if rng.IntN(3) == 0 {
			l.Remove(elems[i])
			if refs[i] != nil {
				ref.Remove(refs[i])
				refs[i] = nil
			}
		} else {
			l.Touch(elems[i])
			if refs[i] != nil {
				ref.MoveToFront(refs[i])
			} else {
				refs[i] = ref.PushFront(i)
			}
		}
		var want []int
		for e := ref.Front(); e != nil; e = e.Next() {
			want = append(want, e.Value.(int))
		}
		require.Equal(t, want, order(t, &l))
	}
}

func TestListTouchAllocatesNothing(t *testing.T) {
	var l List[entry, *entry]
	es := []*entry{{key: 1}, {key: 2}, {key: 3}}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		l.Touch(es[i%3])
		if i%5 == 0 {
			l.Remove(es[(i+1)%3])
		}
		i++
	})
	require.Zero(t, allocs)
}
