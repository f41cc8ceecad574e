package retry

import (
	"math/bits"
	"time"
	"unsafe"
)

// table is a hash table of fixed memory budget whose elements are also
// kept in least-recently-touched order, so that the idle and the least
// recently used are found at the tail in O(1).
//
// It is not a Go map because a map under steady insert/delete churn keeps
// tombstones and grows past its live size by a varying amount (measured:
// 1.1× to 1.3× over a per-element estimate, depending on where the flood
// leaves its tables), which makes a byte cap a guess. Here memory is two
// arrays, owned and sized by us: nodes (a slab with a free list) and slots
// (open addressing with linear probing and backward-shift deletion, so no
// tombstones, at most half full). A slot keeps the low 32 bits of its key's
// hash beside the node index, so that probing and deletion's shifts read
// only the slots: a node is read only for a key whose tag matches, which
// keeps a lookup in a table of megabytes to one cache miss, not one per
// probe (the tracker's find was 2% of a non-stream request's CPU). Nodes hold no pointers, so the GC does
// not scan them. It is not safe for concurrent use.
type table[K hashKey, V any] struct {
	nodes    []tnode[K, V]
	slots    []tslot
	free     int32 // first free node, index + 1; the free list runs through next
	head     int32 // most recently touched, index + 1; 0 when empty
	tail     int32 // least recently touched
	n        int   // live nodes
	maxNodes int   // cap(nodes) never exceeds it
}

// tslot is one entry of the open-addressing array.
type tslot struct {
	tag  uint32 // the low 32 bits of the key's hash: its home slot, since a mask never has more
	node int32  // node index + 1; 0 is empty
}

// hashKey is a key that is already a keyed hash, uniform and not under a
// client's control.
type hashKey interface {
	comparable
	hash() uint64
}

// tnode is a table element. A *tnode is valid until the next add to its
// table (the slab may move).
type tnode[K hashKey, V any] struct {
	key        K
	self       int32 // own index
	prev, next int32 // LRU neighbours, index + 1
	last       time.Duration
	val        V
}

const minNodes = 64

// newTable returns a table that never allocates more than budget bytes
// (at least room for minNodes).
func newTable[K hashKey, V any](budget int64) table[K, V] {
	n := int(budget / (int64(unsafe.Sizeof(tnode[K, V]{})) + 2*int64(unsafe.Sizeof(tslot{}))))
	for n > minNodes && arraysBytes[K, V](n, slotsFor(n)) > budget {
		n -= n/64 + 1
	}
	return table[K, V]{maxNodes: max(n, minNodes)}
}

// arraysBytes is the heap taken by the arrays of nodes nodes and slots
// slots, as the Go allocator rounds them: to a page (8 KiB) above 32 KiB,
// and below it, to a size class, which we bound by the next power of two.
func arraysBytes[K hashKey, V any](nodes, slots int) int64 {
	return allocSize(int64(nodes)*int64(unsafe.Sizeof(tnode[K, V]{}))) + allocSize(int64(slots)*int64(unsafe.Sizeof(tslot{})))
}

func allocSize(n int64) int64 {
	switch {
	case n == 0:
		return 0
	case n <= 32<<10:
		return 1 << bits.Len64(uint64(n-1))
	}
	return (n + 8191) &^ 8191
}

// slotsFor is the slot count for n nodes: a power of two at least 2n.
func slotsFor(n int) int { return 1 << bits.Len(uint(2*n-1)) }

// bytes is the memory the table holds.
func (t *table[K, V]) bytes() int64 { return arraysBytes[K, V](cap(t.nodes), cap(t.slots)) }

func (t *table[K, V]) len() int { return t.n }

func (t *table[K, V]) at(i int32) *tnode[K, V] {
	if i == 0 {
		return nil
	}
	return &t.nodes[i-1]
}

// find returns the slot holding k, or the empty slot where it would go.
func (t *table[K, V]) find(k K) int {
	h := k.hash()
	tag := uint32(h)
	mask := len(t.slots) - 1
	for s := int(h) & mask; ; s = (s + 1) & mask {
		if sl := t.slots[s]; sl.node == 0 || sl.tag == tag && t.nodes[sl.node-1].key == k {
			return s
		}
	}
}

func (t *table[K, V]) get(k K) *tnode[K, V] {
	if t.n == 0 {
		return nil
	}
	return t.at(t.slots[t.find(k)].node)
}

// add inserts k, which must be absent, at the front. When the table is at
// its budget it first evicts the least recently touched node, and says so.
func (t *table[K, V]) add(k K, last time.Duration) (n *tnode[K, V], evicted bool) {
	if t.free == 0 && len(t.nodes) == cap(t.nodes) {
		if cap(t.nodes) < t.maxNodes {
			t.grow()
		} else {
			t.remove(t.at(t.tail))
			evicted = true
		}
	}
	var i int32
	if t.free != 0 {
		i = t.free
		t.free = t.nodes[i-1].next
	} else {
		t.nodes = t.nodes[:len(t.nodes)+1]
		i = int32(len(t.nodes))
	}
	n = &t.nodes[i-1]
	*n = tnode[K, V]{key: k, self: i, last: last}
	t.slots[t.find(k)] = tslot{tag: uint32(k.hash()), node: i}
	t.n++
	t.pushFront(n)
	return n, evicted
}

// grow doubles the slab, up to maxNodes, and rebuilds the slots.
func (t *table[K, V]) grow() {
	nodes := make([]tnode[K, V], len(t.nodes), min(max(2*cap(t.nodes), minNodes), t.maxNodes))
	copy(nodes, t.nodes)
	t.nodes = nodes
	t.slots = make([]tslot, slotsFor(cap(nodes)))
	for i := range t.nodes {
		if n := &t.nodes[i]; n.self != 0 {
			t.slots[t.find(n.key)] = tslot{tag: uint32(n.key.hash()), node: n.self}
		}
	}
}

// remove deletes n and puts its node on the free list.
func (t *table[K, V]) remove(n *tnode[K, V]) {
	t.unlink(n)
	t.deleteSlot(t.find(n.key))
	i := n.self
	n.self, n.next = 0, t.free
	t.free = i
	t.n--
}

// deleteSlot empties slot s and shifts back the entries of its probe run
// that would otherwise become unreachable (Knuth vol. 3, 6.4, Algorithm R).
func (t *table[K, V]) deleteSlot(s int) {
	mask := len(t.slots) - 1
	t.slots[s] = tslot{}
	for j := (s + 1) & mask; t.slots[j].node != 0; j = (j + 1) & mask {
		home := int(t.slots[j].tag) & mask
		// Move j's entry into the hole unless its home lies cyclically in (s, j].
		if (j-home)&mask >= (j-s)&mask {
			t.slots[s], t.slots[j] = t.slots[j], tslot{}
			s = j
		}
	}
}

// touch moves n to the front and records activity at last.
func (t *table[K, V]) touch(n *tnode[K, V], last time.Duration) {
	n.last = max(n.last, last)
	if t.head != n.self {
		t.unlink(n)
		t.pushFront(n)
	}
}

func (t *table[K, V]) pushFront(n *tnode[K, V]) {
	n.prev, n.next = 0, t.head
	if h := t.at(t.head); h != nil {
		h.prev = n.self
	} else {
		t.tail = n.self
	}
	t.head = n.self
}

func (t *table[K, V]) unlink(n *tnode[K, V]) {
	if p := t.at(n.prev); p != nil {
		p.next = n.next
	} else {
		t.head = n.next
	}
	if x := t.at(n.next); x != nil {
		x.prev = n.prev
	} else {
		t.tail = n.prev
	}
	n.prev, n.next = 0, 0
}
