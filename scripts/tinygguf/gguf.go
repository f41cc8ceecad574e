package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// GGUF v3, the file format ggml and ollama load: a header, metadata
// key/value pairs, a tensor table, then tensor data, each tensor aligned.
// All integers are little-endian. Only what the tiny model needs is here.
const (
	ggufMagic     = "GGUF"
	ggufVersion   = 3
	ggufAlignment = 32
)

// Metadata value types (gguf_type in ggml/include/gguf.h).
const (
	typeUint32  uint32 = 4
	typeInt32   uint32 = 5
	typeFloat32 uint32 = 6
	typeBool    uint32 = 7
	typeString  uint32 = 8
	typeArray   uint32 = 9
)

// ggmlTypeF32 is ggml_type GGML_TYPE_F32.
const ggmlTypeF32 uint32 = 0

// kv is one metadata pair. Value is uint32, int32, float32, bool, string,
// []string, []float32 or []int32.
type kv struct {
	Key   string
	Value any
}

// tensor is one F32 tensor. Dims are ggml's ne: Dims[0] is the contiguous
// (innermost) dimension, so a weight with Dims {in, out} is stored as out
// rows of in values. len(Data) is the product of Dims.
type tensor struct {
	Name string
	Dims []uint64
	Data []float32
}

// file is a whole GGUF file, written in the order given (so the bytes are
// a pure function of its contents).
type file struct {
	KVs     []kv
	Tensors []tensor
}

// writeTo writes f as GGUF v3. It is not safe to mutate f concurrently.
func (f *file) writeTo(w io.Writer) error {
	bw := &ggufWriter{w: bufio.NewWriter(w)}
	bw.raw([]byte(ggufMagic))
	bw.u32(ggufVersion)
	bw.u64(uint64(len(f.Tensors)))
	bw.u64(uint64(len(f.KVs)))
	for _, p := range f.KVs {
		bw.str(p.Key)
		if err := bw.value(p.Value); err != nil {
			return fmt.Errorf("metadata %s: %w", p.Key, err)
		}
	}
	var offset uint64
	for _, t := range f.Tensors {
		if n := elems(t.Dims); n != uint64(len(t.Data)) {
			return fmt.Errorf("tensor %s: dims hold %d values, data has %d", t.Name, n, len(t.Data))
		}
		bw.str(t.Name)
		bw.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			bw.u64(d)
		}
		bw.u32(ggmlTypeF32)
		bw.u64(offset)
		offset = align(offset + 4*uint64(len(t.Data)))
	}
	bw.pad()
	for _, t := range f.Tensors {
		for _, v := range t.Data {
			bw.u32(math.Float32bits(v))
		}
		bw.pad()
	}
	if bw.err != nil {
		return bw.err
	}
	return bw.w.Flush()
}

func elems(dims []uint64) uint64 {
	n := uint64(1)
	for _, d := range dims {
		n *= d
	}
	return n
}

func align(n uint64) uint64 { return (n + ggufAlignment - 1) / ggufAlignment * ggufAlignment }

// ggufWriter keeps the first error and counts bytes, for the alignment
// padding.
type ggufWriter struct {
	w   *bufio.Writer
	n   uint64
	err error
}

func (g *ggufWriter) raw(b []byte) {
	if g.err != nil {
		return
	}
	var n int
	n, g.err = g.w.Write(b)
	g.n += uint64(n)
}

func (g *ggufWriter) u32(v uint32) { g.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (g *ggufWriter) u64(v uint64) { g.raw(binary.LittleEndian.AppendUint64(nil, v)) }

func (g *ggufWriter) str(s string) {
	g.u64(uint64(len(s)))
	g.raw([]byte(s))
}

func (g *ggufWriter) pad() {
	if r := align(g.n) - g.n; r > 0 {
		g.raw(make([]byte, r))
	}
}

func (g *ggufWriter) value(v any) error {
	switch v := v.(type) {
	case uint32:
		g.u32(typeUint32)
		g.u32(v)
	case int32:
		g.u32(typeInt32)
		g.u32(uint32(v))
	case float32:
		g.u32(typeFloat32)
		g.u32(math.Float32bits(v))
	case bool:
		g.u32(typeBool)
		b := byte(0)
		if v {
			b = 1
		}
		g.raw([]byte{b})
	case string:
		g.u32(typeString)
		g.str(v)
	case []string:
		g.arrayHeader(typeString, len(v))
		for _, s := range v {
			g.str(s)
		}
	case []float32:
		g.arrayHeader(typeFloat32, len(v))
		for _, f := range v {
			g.u32(math.Float32bits(f))
		}
	case []int32:
		g.arrayHeader(typeInt32, len(v))
		for _, i := range v {
			g.u32(uint32(i))
		}
	default:
		return fmt.Errorf("unsupported metadata type %T", v)
	}
	return nil
}

func (g *ggufWriter) arrayHeader(elem uint32, n int) {
	g.u32(typeArray)
	g.u32(elem)
	g.u64(uint64(n))
}
