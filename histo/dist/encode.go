package dist

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/binary"
	"math"
	"sync"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// The V2 encoding's cookies (hdrhistogram-go's, with the word size 8 in
// the low bits as its encoder writes them).
const (
	v2Cookie           = hdrhistogram.V2EncodingCookieBase | 0x10
	v2CompressedCookie = hdrhistogram.V2CompressedEncodingCookieBase | 0x10
)

// encoder is one Encode's buffers and zlib writer, reused through
// encoders: a zlib writer at best compression holds about 1 MB of
// compressor state, which hdrhistogram-go's own Encode allocates afresh
// for every histogram.
type encoder struct {
	payload []byte       // the uncompressed V2 encoding
	packed  bytes.Buffer // header and compressed payload
	zw      *zlib.Writer
}

var encoders = sync.Pool{New: func() any {
	zw, _ := zlib.NewWriterLevel(nil, zlib.BestCompression) // a valid level: no error
	return &encoder{zw: zw}
}}

// Encode returns h in the HdrHistogram V2 compressed encoding, base64: the
// same bytes as hdrhistogram-go's h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
// (held by TestEncodeMatchesLibrary), which Decode and the Java library
// read. It is the one encoder of the project's histograms: the library's
// takes a fresh zlib writer per call, and a window of a loaded proxy
// encodes about 150 histograms: 107 MiB of garbage and 20 ms of a core at
// every rotation (BENCHMARKS.md, "Session 17"). Safe for concurrent use;
// h must not change during the call.
func Encode(h *hdrhistogram.Histogram) string {
	e := encoders.Get().(*encoder)
	defer encoders.Put(e)
	s := h.Export()
	e.payload = appendV2(e.payload[:0], s)

	var head [8]byte // the cookie, then the compressed length (set below)
	binary.BigEndian.PutUint32(head[:4], uint32(v2CompressedCookie))
	e.packed.Reset()
	e.packed.Write(head[:])
	e.zw.Reset(&e.packed)
	e.zw.Write(e.payload) // to a bytes.Buffer: cannot fail
	e.zw.Close()
	b := e.packed.Bytes()
	binary.BigEndian.PutUint32(b[4:8], uint32(len(b)-8))
	return base64.StdEncoding.EncodeToString(b)
}

// appendZigZag appends v as the V2 encoding's ZigZag LEB128-64b9B long:
// seven bits a byte, low first, with a ninth byte of eight bits (so at most
// nine bytes, where a uvarint takes ten).
func appendZigZag(b []byte, v int64) []byte {
	u := uint64((v << 1) ^ (v >> 63))
	for range 8 {
		if u < 0x80 {
			return append(b, byte(u))
		}
		b = append(b, byte(u)|0x80)
		u >>= 7
	}
	return append(b, byte(u))
}

// appendV2 appends the uncompressed V2 encoding of s: a 40-byte header,
// then the counts up to the last non-zero one as ZigZag LEB128 longs, a
// run of two or more zero counts written as its negated length.
func appendV2(b []byte, s *hdrhistogram.Snapshot) []byte {
	limit := 1 // the library writes at least the first count
	for i := len(s.Counts) - 1; i > 0; i-- {
		if s.Counts[i] != 0 {
			limit = i + 1
			break
		}
	}
	ratio := s.IntegerToDoubleConversionRatio
	if ratio == 0 {
		ratio = 1
	}
	start := len(b)
	b = binary.BigEndian.AppendUint32(b, uint32(v2Cookie))
	b = binary.BigEndian.AppendUint32(b, 0) // the counts' length, set below
	b = binary.BigEndian.AppendUint32(b, 0) // normalizing index offset: counts are stored unrotated
	b = binary.BigEndian.AppendUint32(b, uint32(s.SignificantFigures))
	b = binary.BigEndian.AppendUint64(b, uint64(s.LowestTrackableValue))
	b = binary.BigEndian.AppendUint64(b, uint64(s.HighestTrackableValue))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(ratio))
	counts := len(b)
	for i := 0; i < limit; {
		c := s.Counts[i]
		i++
		if c == 0 {
			zeros := int64(1)
			for i < limit && s.Counts[i] == 0 {
				zeros++
				i++
			}
			if zeros > 1 {
				c = -zeros
			}
		}
		b = appendZigZag(b, c)
	}
	binary.BigEndian.PutUint32(b[start+4:start+8], uint32(len(b)-counts))
	return b
}
