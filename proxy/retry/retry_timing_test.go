package retry

import (
	"encoding/binary"
	"testing"
	"time"
)

// BenchmarkBegin is Begin plus End for a 100 KiB body (a long agent
// context) that the client sends again each time: the cost per request is
// the body hash; a retry storm takes this path.
func BenchmarkBegin(b *testing.B) {
	tr := New(Config{Now: time.Now})
	r := req("", 1)
	r.Body = make([]byte, 100<<10)
	b.SetBytes(int64(len(r.Body)))
	b.ReportAllocs()
	for b.Loop() {
		res := tr.Begin(r)
		tr.End(&res, status(429))
	}
}

// BenchmarkBeginNew is Begin plus End for a distinct 100 KiB body each
// time: every request a new logical request, the index full and evicting.
func BenchmarkBeginNew(b *testing.B) {
	tr := New(Config{Now: time.Now, MaxBytes: 1 << 20})
	r := req("", -1)
	r.Body = make([]byte, 100<<10)
	b.SetBytes(int64(len(r.Body)))
	b.ReportAllocs()
	i := uint64(0)
	for b.Loop() {
		i++
		binary.LittleEndian.PutUint64(r.Body, i)
		res := tr.Begin(r)
		tr.End(&res, status(200))
	}
}

// BenchmarkBeginParallel is the lock's contention: small distinct bodies
// from every core at once.
func BenchmarkBeginParallel(b *testing.B) {
	tr := New(Config{Now: time.Now})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := req("", -1)
		r.Body = make([]byte, 512)
		i := uint64(time.Now().UnixNano())
		for pb.Next() {
			i++
			binary.LittleEndian.PutUint64(r.Body, i)
			res := tr.Begin(r)
			tr.End(&res, status(200))
		}
	})
}

// BenchmarkBeginFullSmall is Begin plus End for a distinct 60-byte body
// each time at the default budget, the index full: what a non-stream
// request pays, where the table is megabytes and each lookup a cache miss.
func BenchmarkBeginFullSmall(b *testing.B) {
	tr := New(Config{Now: time.Now})
	r := req("", -1)
	r.Body = make([]byte, 60)
	i := uint64(0)
	one := func() {
		i++
		binary.LittleEndian.PutUint64(r.Body, i)
		res := tr.Begin(r)
		tr.End(&res, status(200))
	}
	for range 1 << 20 { // fill the index, and past it
		one()
	}
	b.ReportAllocs()
	for b.Loop() {
		one()
	}
}
