package histo

import (
	"testing"
	"time"
)

// BenchmarkRecordTracked is BenchmarkRecord for requests whose prompt was
// tracked: 1,000 conversations taking turns, so that every request also
// updates its conversation, the prompt ledger and its concurrency level.
func BenchmarkRecordTracked(b *testing.B) {
	r, _, _ := newTest(b, Config{Now: time.Now})
	const convs = 1000
	base := monotonic(chat())
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%50_000 == 49_999 {
			b.StopTimer()
			r.Rotate()
			b.StartTimer()
		}
		tr := base
		shift := time.Duration(i) * time.Millisecond
		tr.Recv, tr.Admit, tr.FirstOutput, tr.End, tr.ClientDone = tr.Recv.Add(shift), tr.Admit.Add(shift), tr.FirstOutput.Add(shift), tr.End.Add(shift), tr.ClientDone.Add(shift)
		tr.InflightAtAdmit = i % 8
		tr.Prefix = composed(i/convs, 4096, 8192, int64(i/convs)*8192, 1024)
		tr.Prefix.ConversationID = uint64(i%convs + 1)
		r.Record(&tr)
	}
}
