package prefix

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"sort"
	"unsafe"
)

// Geometry of a fingerprint. fineLimit is a multiple of blockSize, and both
// are multiples of 8 (the sketch works a word at a time).
const (
	blockSize = 64
	maxBlocks = 1 << 14  // block hashes cover the first 1 MiB of a segment
	fineLimit = 64 << 10 // byte-exact offsets in the first 64 KiB of a segment
)

// fingerprint is what the index keeps of one segment in place of its text:
// enough to tell where and how a later version of it differs. It holds keyed
// hashes and lengths only; without the Tracker's key they say nothing about
// the text, and with it they can only confirm guesses. One fingerprint
// serves every prompt that contains the same segment.
type fingerprint struct {
	hash    uint64 // kind, role and canonical text
	size    int    // canonical bytes
	content int    // of which content text (see canon)
	rest    uint64 // hash of the bytes after the content text
	digits  uint64 // hash with every digit run replaced by one '#'
	spaces  uint64 // hash with all whitespace removed
	toolSet uint64 // tools: order-free sum of the tools' hashes
	parts   []uint32
	// sketch holds the fine hashes (one byte per text byte, for the first
	// fineLimit bytes), then the block hashes (a little-endian uint32 per
	// full 64-byte block, for the first maxBlocks blocks). Both come from
	// one keyed chain over the text, so each value depends on the whole
	// prefix before it: the first position where two sketches differ is
	// where the texts first differ.
	sketch []byte
	fine   int // fine hashes in sketch
	refs   int32
	kind   SegmentKind
	role   Role
}

func (f *fingerprint) blocks() int { return (len(f.sketch) - f.fine) / 4 }

func (f *fingerprint) block(i int) uint32 {
	return binary.LittleEndian.Uint32(f.sketch[f.fine+4*i:])
}

// memBytes is what the fingerprint costs in the index: the struct, its
// slices and its map entry.
func (f *fingerprint) memBytes() int64 {
	return allocBytes(int(unsafe.Sizeof(*f))) + allocBytes(cap(f.sketch)) + allocBytes(4*cap(f.parts)) + mapEntryBytes
}

// keys are the per-process secrets all hashes depend on.
type keys struct {
	seed  maphash.Seed
	chain uint64
}

// maskBufs are reusable buffers for the masked copies of a segment.
type maskBufs struct{ digits, spaces []byte }

// newFingerprint fingerprints the canonical text of seg; parts are the
// tools' start offsets.
func (k *keys) newFingerprint(seg *segment, text []byte, parts []uint32, mb *maskBufs) *fingerprint {
	f := &fingerprint{hash: seg.hash, size: len(text), content: seg.content, kind: seg.kind, role: seg.role}
	f.rest = maphash.Bytes(k.seed, text[seg.content:])
	var d, w []byte
	mb.digits, mb.spaces, d, w = masked(text, mb.digits, mb.spaces)
	f.digits = maphash.Bytes(k.seed, d)
	f.spaces = maphash.Bytes(k.seed, w)
	if len(parts) > 0 {
		f.parts = append([]uint32(nil), parts...)
		for i, p := range parts {
			end := len(text)
			if i+1 < len(parts) {
				end = int(parts[i+1]) - 1 // without the separator
			}
			f.toolSet += mix(maphash.Bytes(k.seed, text[p:end]))
		}
	}
	f.fine = min(len(text), fineLimit)
	nb := min(len(text)/blockSize, maxBlocks)
	f.sketch = make([]byte, f.fine+4*nb)
	sketch(text, k.chain, f.sketch[:f.fine], f.sketch[f.fine:])
	return f
}

// Odd multipliers from splitmix64 and xxhash; the key makes the
// chain unpredictable, the multipliers only mix.
const (
	mulChain = 0xbf58476d1ce4e5b9
	mulFine  = 0x94d049bb133111eb
	mulMix   = 0x9e3779b97f4a7c15
)

// sketch runs the keyed chain over text a 64-bit word at a time. The state
// after each word is a bijection of the state before it for a fixed word,
// so two texts that differ once keep differing states; blocks gets the top
// half of the state at each block end. fine gets fineWord of each word.
func sketch(text []byte, key uint64, fine, blocks []byte) {
	s := key
	end := max(len(fine), len(blocks)/4*blockSize)
	off := 0
	for ; off+8 <= len(text) && off < end; off += 8 {
		x := binary.LittleEndian.Uint64(text[off:])
		if off+8 <= len(fine) {
			binary.LittleEndian.PutUint64(fine[off:], fineWord(s, x))
		}
		s = (s ^ x) * mulChain
		s ^= s >> 31
		if e := off + 8; e%blockSize == 0 {
			if b := e/blockSize - 1; 4*b < len(blocks) {
				binary.LittleEndian.PutUint32(blocks[4*b:], uint32(s>>32))
			}
		}
	}
	if off < len(fine) { // a last partial word
		var w [8]byte
		n := copy(w[:], text[off:len(fine)])
		f := fineWord(s, binary.LittleEndian.Uint64(w[:]))
		binary.LittleEndian.PutUint64(w[:], f)
		copy(fine[off:], w[:n])
	}
}

// fineWord returns the eight fine hashes of word x after chain state s:
// byte j is the top byte of a product of the state with the word's bytes
// 0..j, a lossy keyed hash of the text up to byte j. (Lower bytes of one
// product would also depend on bytes 0..j only, since carries run upward,
// but each would be a bijection of the text byte: a cipher, not a hash.)
func fineWord(s, x uint64) uint64 {
	return (s^x&0xff)*mulFine>>56 |
		(s^x&0xffff)*mulFine>>56<<8 |
		(s^x&0xffffff)*mulFine>>56<<16 |
		(s^x&0xffffffff)*mulFine>>56<<24 |
		(s^x&0xffffffffff)*mulFine>>56<<32 |
		(s^x&0xffffffffffff)*mulFine>>56<<40 |
		(s^x&0xffffffffffffff)*mulFine>>56<<48 |
		(s^x)*mulFine>>56<<56
}

func mix(x uint64) uint64 {
	x ^= x >> 31
	x *= mulMix
	return x ^ x>>29
}

// masked writes text with every digit run replaced by one '#' into d,
// and text without whitespace (any byte up to the space, which also takes
// control bytes) into w, growing the buffers as needed. Eight bytes at a
// time: a word without digits is copied whole to d, and each word goes to w
// with its whitespace bytes closed over.
func masked(text, dbuf, wbuf []byte) (dNew, wNew, d, w []byte) {
	if cap(dbuf) < len(text)+8 {
		dbuf = make([]byte, len(text)+8)
	}
	if cap(wbuf) < len(text)+8 {
		wbuf = make([]byte, len(text)+8)
	}
	dbuf, wbuf = dbuf[:cap(dbuf)], wbuf[:cap(wbuf)]
	i, j, p := 0, 0, 0
	prev := false // the byte before p was a digit
	for ; p+8 <= len(text); p += 8 {
		x := binary.LittleEndian.Uint64(text[p:])
		dg := above(x, '0'-1) & below(x, '9'+1)
		ws := below(x, ' '+1)
		if dg == 0 {
			binary.LittleEndian.PutUint64(dbuf[i:], x)
			i += 8
			prev = false
		} else {
			i, prev = maskDigits(dbuf, i, text[p:p+8], prev)
		}
		for m := ws; m != 0; { // close over each whitespace byte, highest first
			hb := 63 - bits.LeadingZeros64(m)
			low := uint64(1)<<(hb&^7) - 1
			x = x&low | x>>8&^low
			m &^= 1 << hb
		}
		binary.LittleEndian.PutUint64(wbuf[j:], x)
		j += 8 - bits.OnesCount64(ws)
	}
	i, _ = maskDigits(dbuf, i, text[p:], prev)
	j = dropSpaces(wbuf, j, text[p:])
	return dbuf, wbuf, dbuf[:i], wbuf[:j]
}

// SWAR constants: ones has 1 in every byte, highs the high bit of every byte.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// below returns a mask with the high bit set in each byte of x that is
// less than n (n <= 128); exact, with no carries between bytes.
func below(x uint64, n byte) uint64 {
	return ^((x | highs) - uint64(n)*ones) & ^x & highs
}

// above returns a mask with the high bit set in each byte of x that is
// greater than n (n < 128).
func above(x uint64, n byte) uint64 {
	return ((x &^ highs) + uint64(0x7f-n)*ones | x) & highs
}

func maskDigits(d []byte, i int, b []byte, prev bool) (int, bool) {
	for _, c := range b {
		digit := '0' <= c && c <= '9'
		switch {
		case !digit:
			d[i] = c
			i++
		case !prev:
			d[i] = '#'
			i++
		}
		prev = digit
	}
	return i, prev
}

func dropSpaces(w []byte, j int, b []byte) int {
	for _, c := range b {
		if c > ' ' {
			w[j] = c
			j++
		}
	}
	return j
}

// firstDiff returns where the texts of a and b first differ and whether
// that offset is exact. The precision guarantee:
//
//   - in the first 64 KiB of a segment, exact, except with probability
//     2⁻⁸ (when the fine hashes of the first differing byte collide), when
//     it is later than the truth but inside the same 64-byte block;
//   - from 64 KiB to 1 MiB, the start of the first differing 64-byte block
//     (exact false);
//   - past 1 MiB, 1 MiB (exact false).
//
// When one text is a prefix of the other the offset is the shorter length.
func firstDiff(a, b *fingerprint) (int, bool) {
	n := min(a.size, b.size)
	nb := min(a.blocks(), b.blocks())
	i := 0
	for i < nb && a.block(i) == b.block(i) {
		i++
	}
	known := i * blockSize // both texts agree before known
	fine := min(a.fine, b.fine)
	end := n
	if i < nb {
		end = known + blockSize
	}
	for p := known; p < min(end, fine); p++ {
		if a.sketch[p] != b.sketch[p] {
			return p, true
		}
	}
	if i < nb {
		return known, false // the block hashes differ but the fine ones agree: beyond the fine range, or a collision
	}
	if verified := max(known, min(n, fine)); verified < n {
		return verified, false
	}
	return n, true
}

// sameSlot reports whether two segments can be compared byte by byte: same
// kind and role (role is rendered before the text, so a changed role
// diverges at offset 0).
func sameSlot(a, b *fingerprint) bool { return a.kind == b.kind && a.role == b.role }

// classify names the change from p (the previous prompt's segment) to r
// (the new request's segment at the same position). fewer reports that the
// new request drops history: it has fewer segments than the previous prompt,
// or a later message of the previous prompt appears earlier in it.
func classify(r, p *fingerprint, off int, exact, fewer bool) Class {
	if r.kind == SegmentTools && p.kind == SegmentTools && r.toolSet == p.toolSet && len(r.parts) == len(p.parts) {
		return ClassToolOrder
	}
	same := sameSlot(r, p)
	switch {
	case same && r.digits == p.digits:
		return ClassDigits
	case same && r.spaces == p.spaces:
		return ClassWhitespace
	case fewer && (history(r.kind) || history(p.kind)):
		return ClassTruncation
	case same && exact && off == r.content && r.content < p.content && r.rest == p.rest:
		return ClassTruncation // the content was cut short
	}
	return ClassOther
}

// history reports whether segments of kind k are conversation history.
func history(k SegmentKind) bool { return k == SegmentMessage || k == SegmentPrompt }

// toolAt returns the index of the tool that holds offset off.
func toolAt(parts []uint32, off int) int {
	i := sort.Search(len(parts), func(i int) bool { return int(parts[i]) > off })
	return max(i-1, 0)
}

// allocBytes rounds a heap allocation of n bytes up the way the Go
// allocator does, closely enough for accounting: size classes are at most
// 12.5% apart below 32 KiB, larger objects take whole 8 KiB pages.
func allocBytes(n int) int64 {
	switch {
	case n == 0:
		return 0
	case n <= 16:
		return 16
	case n <= 32<<10:
		step := 1 << (bits.Len(uint(n)) - 3) // an eighth of the power of two below n
		step = max(step, 16)
		return int64((n + step - 1) / step * step)
	}
	return int64((n + 8191) &^ 8191)
}
