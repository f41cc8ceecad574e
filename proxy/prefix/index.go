package prefix

import (
	"unsafe"

	"github.com/anvilproxy/anvilproxy/proxy/lru"
)

// mapEntryBytes is what one entry of a map[uint64]*T costs: Go's swiss
// tables spend 17 bytes a slot (8-byte key, 8-byte pointer, a control
// byte) at 44–88% load, so 19–39 bytes an entry; measured up to 42 on small
// maps. Maps never shrink, so each map is charged for its peak size (see
// index.mapBytes) and rebuilt when it falls to a quarter of it.
const mapEntryBytes = 40

var nodeBytes = allocBytes(int(unsafe.Sizeof(node{})))

// node is one segment of one prompt path: the index is a trie keyed by the
// cumulative hash of each prefix, with one node per distinct prefix.
// Prompts that share a prefix share its nodes, so a conversation of n turns
// costs one node per distinct segment, not n².
type node struct {
	lru.Links[node]
	key    uint64 // cumulative hash of the prefix ending here
	parent *node  // the root sentinel for the first segment
	// next is the child on the path of the most recent prompt that went
	// through this node, or nil if that prompt ended here. Following next
	// from any node therefore walks the most recent prompt through it.
	next  *node
	fp    *fingerprint
	raw   uint64 // unmasked hash of this segment in the most recent prompt through here
	conv  uint64
	cum   int64 // canonical prompt bytes up to and including this segment
	depth int32 // segments up to and including this one
	turn  int32 // Turn of the most recent prompt through here
}

// index is the bounded, memory-accounted trie of prompt prefixes, with the
// fingerprints its nodes share and an anchor map from each message's hash
// to the most recent node holding it (to find the conversation of a
// request whose early segments changed). It is not safe for concurrent
// use; the Tracker locks around it.
//
// Eviction is least-recently-used by node. A request touches its whole path
// from the leaf up, so a node is never older than its descendants and the
// LRU tail is always a leaf: eviction never cuts a path in the middle.
type index struct {
	nodes   map[uint64]*node
	anchors map[uint64]*node
	fps     map[uint64]*fingerprint
	// memo maps the hash of a segment's text before volatile patterns ran
	// to its fingerprint, so that known text is not matched again. Entries
	// whose fingerprint has left the index are dropped when met, and all at
	// once when they outnumber the live ones.
	memo  map[uint64]*fingerprint
	root  node                  // sentinel parent of first segments; never in order
	order lru.List[node, *node] // every other node, most recently used first

	objBytes                              int64 // nodes and fingerprints
	peakNodes, peakAnch, peakFp, peakMemo int
	cap                                   int64
	evictions                             uint64
}

func (x *index) init(cap int64) {
	x.nodes = make(map[uint64]*node)
	x.anchors = make(map[uint64]*node)
	x.fps = make(map[uint64]*fingerprint)
	x.memo = make(map[uint64]*fingerprint)
	x.cap = cap
}

// bytes is the accounted size of the index.
func (x *index) bytes() int64 { return x.objBytes + x.mapBytes() }

func (x *index) mapBytes() int64 {
	return mapEntryBytes * int64(x.peakNodes+x.peakAnch+x.peakFp+x.peakMemo)
}

// pin returns the fingerprint of segment hash h, if any, holding a
// reference so that it outlives any eviction until unpin.
func (x *index) pin(h uint64) *fingerprint {
	f := x.fps[h]
	if f != nil {
		f.refs++
	}
	return f
}

// adopt pins f, or the fingerprint already indexed for its hash.
func (x *index) adopt(f *fingerprint) *fingerprint {
	if old := x.pin(f.hash); old != nil {
		return old
	}
	f.refs = 1
	x.fps[f.hash] = f
	x.peakFp = max(x.peakFp, len(x.fps))
	x.objBytes += f.memBytes() - mapEntryBytes
	return f
}

func (x *index) unpin(f *fingerprint) {
	if f.refs--; f.refs == 0 {
		delete(x.fps, f.hash)
		x.objBytes -= f.memBytes() - mapEntryBytes
	}
}

// remembered returns the fingerprint of the masked text whose unmasked
// text hashed to pre, if the index still holds it.
func (x *index) remembered(pre uint64) *fingerprint {
	f := x.memo[pre]
	if f != nil && x.fps[f.hash] != f {
		delete(x.memo, pre)
		return nil
	}
	return f
}

// remember records that unmasked text hashing to pre masks to f.
func (x *index) remember(pre uint64, f *fingerprint) {
	if len(x.memo) >= 2*len(x.fps)+1024 {
		for k, g := range x.memo {
			if x.fps[g.hash] != g {
				delete(x.memo, k)
			}
		}
	}
	x.memo[pre] = f
	x.peakMemo = max(x.peakMemo, len(x.memo))
}

// add creates the node for a prefix whose parent is p.
func (x *index) add(key uint64, p *node, f *fingerprint, seg *segment, depth int, conv uint64) *node {
	n := &node{key: key, parent: p, fp: f, conv: conv, cum: seg.total, depth: int32(depth)}
	f.refs++
	x.nodes[key] = n
	x.peakNodes = max(x.peakNodes, len(x.nodes))
	x.objBytes += nodeBytes
	return n
}

// anchor makes n the node found for message hash h.
func (x *index) anchor(h uint64, n *node) {
	x.anchors[h] = n
	x.peakAnch = max(x.peakAnch, len(x.anchors))
}

// touch makes n the most recently used node.
func (x *index) touch(n *node) { x.order.Touch(n) }

// shrink evicts least recently used nodes until the index fits its cap.
func (x *index) shrink() {
	for x.bytes() > x.cap {
		if x.compact() {
			continue
		}
		oldest := x.order.Oldest()
		if oldest == nil { // nothing left: every memo entry is stale
			x.memo, x.peakMemo = make(map[uint64]*fingerprint), 0
			return
		}
		x.evict(oldest)
	}
}

func (x *index) evict(n *node) {
	x.order.Remove(n)
	delete(x.nodes, n.key)
	if x.anchors[n.fp.hash] == n {
		delete(x.anchors, n.fp.hash)
	}
	if n.parent.next == n {
		n.parent.next = nil
	}
	x.unpin(n.fp)
	x.objBytes -= nodeBytes
	x.evictions++
}

// compact rebuilds the maps that have fallen to a quarter of their peak
// size, since Go maps keep their peak capacity, and reports whether it
// freed anything.
func (x *index) compact() bool {
	did := false
	if 4*len(x.nodes) < x.peakNodes {
		x.nodes, x.peakNodes, did = rebuild(x.nodes), len(x.nodes), true
	}
	if 4*len(x.anchors) < x.peakAnch {
		x.anchors, x.peakAnch, did = rebuild(x.anchors), len(x.anchors), true
	}
	if 4*len(x.fps) < x.peakFp {
		x.fps, x.peakFp, did = rebuild(x.fps), len(x.fps), true
	}
	if 4*len(x.memo) < x.peakMemo {
		x.memo, x.peakMemo, did = rebuild(x.memo), len(x.memo), true
	}
	return did
}

func rebuild[V any](m map[uint64]V) map[uint64]V {
	r := make(map[uint64]V, len(m))
	for k, v := range m {
		r[k] = v
	}
	return r
}

// promptThrough appends to dst the nodes of the most recent prompt through
// n: its ancestors, n, then the next chain.
func promptThrough(dst []*node, n *node) []*node {
	start := len(dst)
	for p := n; p.depth > 0; p = p.parent {
		dst = append(dst, p)
	}
	for i, j := start, len(dst)-1; i < j; i, j = i+1, j-1 {
		dst[i], dst[j] = dst[j], dst[i]
	}
	for p := n.next; p != nil; p = p.next {
		dst = append(dst, p)
	}
	return dst
}
