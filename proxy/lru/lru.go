// Package lru keeps elements in least-recently-used order with links the
// elements carry themselves, so that a cache of structs needs neither a
// second allocation per element (as container/list's Element) nor its own
// copy of the list code. The prompt-prefix index (proxy/prefix), the
// conversation table (histo), the upstream pool's idle connections and the
// listener's idle client connections (proxy) use it. The retry tracker's table
// (proxy/retry) does not: it keeps its order in pointer-free index links
// so that the garbage collector never scans it.
//
// A List is not safe for concurrent use; its owner locks around it. An
// element belongs to at most one List at a time.
package lru

// Links are the list pointers of an element. A type joins a List by
// embedding Links of itself:
//
//	type entry struct {
//		lru.Links[entry]
//		key uint64
//	}
//	var l lru.List[entry, *entry]
type Links[T any] struct {
	newer, older *T
}

func (l *Links[T]) links() *Links[T] { return l }

// elem is a *T whose T embeds Links[T]; the unexported method makes
// embedding the only way to satisfy it.
type elem[T any] interface {
	*T
	links() *Links[T]
}

// List is a doubly linked list from the most to the least recently used
// element. The zero value is an empty list.
type List[T any, P elem[T]] struct {
	newest, oldest P
	n              int
}

// Len is the number of elements in l.
func (l *List[T, P]) Len() int { return l.n }

// Newest is the most recently used element, or nil.
func (l *List[T, P]) Newest() P { return l.newest }

// Oldest is the least recently used element, or nil.
func (l *List[T, P]) Oldest() P { return l.oldest }

// Older is the element used just before x, or nil.
func (l *List[T, P]) Older(x P) P { return x.links().older }

// Contains reports whether x is in l.
func (l *List[T, P]) Contains(x P) bool {
	return x.links().newer != nil || l.newest == x
}

// Touch makes x, which may or may not be in l, the most recently used.
func (l *List[T, P]) Touch(x P) {
	if l.newest == x {
		return
	}
	if l.Contains(x) {
		l.unlink(x)
	}
	lx := x.links()
	lx.older = l.newest
	if l.newest != nil {
		P(l.newest).links().newer = x
	} else {
		l.oldest = x
	}
	l.newest = x
	l.n++
}

// Remove takes x out of l; it does nothing when x is not in l.
func (l *List[T, P]) Remove(x P) {
	if l.Contains(x) {
		l.unlink(x)
	}
}

func (l *List[T, P]) unlink(x P) {
	lx := x.links()
	if lx.newer != nil {
		P(lx.newer).links().older = lx.older
	} else {
		l.newest = lx.older
	}
	if lx.older != nil {
		P(lx.older).links().newer = lx.newer
	} else {
		l.oldest = lx.newer
	}
	lx.newer, lx.older = nil, nil
	l.n--
}
