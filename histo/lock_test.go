package histo

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestJoinedFirstBatch holds the first-batch join to llamarunner's
// batches (joinedFirstBatch): a request whose slot came free as a group of
// prefills began joined at the group's first batch only when the group
// ran past its summed solo time, and a group at that speed was joined by
// nobody.
func TestJoinedFirstBatch(t *testing.T) {
	ms := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
	type pre struct{ s0, f, pt, pb float64 }
	cases := []struct {
		name    string
		pres    []pre
		start0  float64
		want    bool
		wantEnd float64
	}{
		// ollama P=4: a 695-token prefill, 140 ms alone (102 ms its first
		// 512 tokens), took 436 ms: three waiters shared its second batch.
		{"slowed holder", []pre{{591, 1027, 140, 102}}, 590, true, 693},
		{"holder at its speed", []pre{{134, 252, 119, 105}}, 130, false, 0},
		// Two prefills begun together, done within their summed
		// estimates: they shared their batches, nobody joined them.
		{"co-held pair at its speed", []pre{{639, 1048, 155, 105}, {640, 1049, 175, 105}}, 639, false, 0},
		// The same pair twice as slow: a joiner shared its batches.
		{"co-held pair slowed", []pre{{639, 1700, 155, 105}, {640, 1701, 175, 105}}, 639, true, 849},
		{"one batch", []pre{{591, 1027, 140, 0}}, 590, false, 0},
		{"slot free later", []pre{{591, 1027, 140, 102}}, 620, false, 0},
		{"member without estimate", []pre{{591, 1027, 140, 102}, {592, 1026, 0, 0}}, 590, false, 0},
		// A waiter placed at its arrival, with the holder's start, whose
		// prefill ended after the holder's did not begin with it: it is no
		// member, and neither its estimate nor its first batch is the
		// group's (loaded ollama P=4 hint 4, run 12: a 762-token holder
		// and a waiter, both placed at 715 ms; with the waiter a member
		// the pair looked solo, 551 ms against 413, and the third waiter
		// was placed at the holder's end, 1266 ms, where the engine gave
		// its slot at 860).
		{"waiter in the start window", []pre{{715, 1266, 214, 146}, {715, 1584, 199, 146}}, 715, true, 861},
	}
	for _, c := range cases {
		var o occupancy
		for i, p := range c.pres {
			o.pre[0][i], o.pre[1][i], o.pre[2][i], o.pre[3][i] = ms(p.s0), ms(p.f), ms(p.pt), ms(p.pb)
		}
		o.nPre = len(c.pres)
		end, ok := o.joinedFirstBatch(0, ms(c.start0))
		if ok != c.want || ok && time.Duration(end-ms(c.wantEnd)).Abs() > time.Millisecond {
			t.Errorf("%s: joined %v at %.0f ms, want %v at %.0f", c.name, ok, float64(end)/1e6, c.want, c.wantEnd)
		}
	}
}

// TestJoinedFirstBatchLiveWithoutEstimate: a member of the group still in
// flight whose first output carried no estimate (its prompt not sized:
// no body size, or nothing learned when it came) is left out of the
// group's sums; a recorded member without one still leaves the group
// unjudged (TestJoinedFirstBatch "member without estimate"). Before, the
// live one did too, and the waiter that joined the slowed holder at its
// first batch's end was placed at its end.
func TestJoinedFirstBatchLiveWithoutEstimate(t *testing.T) {
	ms := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
	var o occupancy
	for i, p := range [][4]float64{{591, 1027, 140, 102}, {592, 1026, 0, 0}} {
		o.pre[0][i], o.pre[1][i], o.pre[2][i], o.pre[3][i] = ms(p[0]), ms(p[1]), ms(p[2]), ms(p[3])
	}
	o.nPre, o.preLive[1] = 2, true
	end, ok := o.joinedFirstBatch(0, ms(590))
	require.True(t, ok)
	require.Equal(t, ms(693), end, "joined at %.1f ms", float64(end)/1e6)
}

// TestLockEndJudgedPerStep: e arrived with x1 and waited for its prefill
// (0–100 ms); x2 took its slot at x1's end and prefilled alone to 200 ms;
// e's first output at 230 ms is its 130 ms prefill from x1's end, which it
// shared with x2's start. "Too long for e alone" is judged from the start
// as it stands at each step: from x1's end (130 ms of 130) it is not, and
// e did not wait for x2 too. Judged once from e's arrival (229 ms), it
// was, and e was placed at x2's end with 30 ms left for a 130 ms prefill.
func TestLockEndJudgedPerStep(t *testing.T) {
	ms := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
	var o occupancy
	for i, p := range [][3]float64{{0, 100, 100}, {100, 200, 100}} {
		o.pre[0][i], o.pre[1][i], o.pre[2][i] = ms(p[0]), ms(p[1]), ms(p[2])
	}
	o.nPre = 2
	e := occEntry{arrive: ms(1), first: ms(230)}
	end, solo := o.lockEnd(e, e.arrive, ms(5), 130*time.Millisecond)
	require.Equal(t, ms(100), end, "start under the lock %.0f ms", float64(end)/1e6)
	require.True(t, solo)
}

// TestLockEndLastBatchJoin: a one-batch request whose first output came
// with its holder's (0.3 ms before it) joined it at its first batch's end
// and was done in its last batch; before, a prefill that ended so close to
// e's first output was taken for one e shared from its start, and e stayed
// at its arrival (loaded ollama P=4 hint 4, run 3: request 7, 516 tokens,
// holder 563, the engine's slot 94 ms into the holder's prefill; placed at
// its first batch's end, 100.8 ms). A two-batch request with the same
// first output gives the same outputs had it shared from the start, and
// stays, without a vote.
func TestLockEndLastBatchJoin(t *testing.T) {
	ms := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
	for _, c := range []struct {
		name string
		pb   float64
		want float64
	}{{"one batch", 0, 100.8}, {"two batches", 90, 0}} {
		var o occupancy
		o.pre[0][0], o.pre[1][0], o.pre[2][0], o.pre[3][0] = 0, ms(364.3), ms(108), ms(100.8)
		o.nPre = 1
		point := 98800 * time.Microsecond
		e := occEntry{arrive: 0, first: ms(364), pb: ms(c.pb)}
		end, solo := o.lockEnd(e, e.arrive, leastWait(point), point)
		require.Equal(t, ms(c.want), end, "%s: start under the lock %.1f ms", c.name, float64(end)/1e6)
		// Its prefill from the join, shared, fits no estimate: the join
		// itself is its "held" vote (a fresh proxy's first burst has no
		// other, and split it as unqueued).
		want := lockNone
		if c.want > 0 {
			want = lockHeld
		}
		require.Equal(t, want, lockVote(&o, e, e.arrive, end, solo, point, 0, false), c.name)
	}
}

// TestJoinIsHeldVote: a request placed at the first batch's end of a
// slowed holder (joinedFirstBatch) votes "held" though its prefill from
// there, shared with the holder's second batch, fits no estimate: before,
// it voted none, and a fresh proxy that had not learned the lock split it
// as unqueued (quiet ollama P=2 hint run 3, request 12: −163 ms of 841).
func TestJoinIsHeldVote(t *testing.T) {
	ms := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
	var o occupancy
	o.pre[0][0], o.pre[1][0], o.pre[2][0], o.pre[3][0] = ms(591), ms(1027), ms(140), ms(102)
	o.nPre = 1
	point := 100 * time.Millisecond
	e := occEntry{arrive: ms(590), first: ms(1300)}
	end, solo := o.lockEnd(e, e.arrive, leastWait(point), point)
	require.Equal(t, ms(693), end, "start under the lock %.1f ms", float64(end)/1e6)
	require.Equal(t, lockHeld, lockVote(&o, e, e.arrive, end, solo, point, 0, false))
}

// TestLockEndBehindBatch: four slots came free within 1 ms (ollama P=4,
// agents-p4-s8run06); x1 and x2, one batch each, took the runner's lock
// together and shared one batch (745.5–890.3 ms), and e, placed at the
// same start, took its slot at their end: its one-batch prompt (35 ms by
// its estimate) has its first output 103 ms after theirs, so it shared
// none of their batches. It was taken for one that began with them, and
// split 144 ms short. A prompt of two batches by its estimate, or one
// whose first output came less than a prefill of its own after theirs
// (its tail; or, on an engine whose shared prefills end in their order of
// size, the simulator's SharedPrefill, its share), may have shared their
// first batch and stays.
func TestLockEndBehindBatch(t *testing.T) {
	ms := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
	for _, c := range []struct {
		name      string
		first, pb float64
		want      float64
	}{
		{"one batch, a prefill after theirs", 993.5, 0, 890.3},
		{"two batches", 993.5, 30, 745.5},
		{"one batch, its tail after theirs", 905, 0, 745.5},     // 14.7 ms after: 0.42 of its 35 ms
		{"one batch, shared by time", 915.6, 0, 745.5},          // 25.3 ms after: 0.72 of it, under 1/pointHigh
		{"one batch, within the slack", 918, 0, 745.5},          // 27.7 ms after: 0.79 of it, under 1/pointHigh of it + 5 ms
		{"one batch, its estimate after theirs", 925, 0, 890.3}, // 34.7 ms after: 0.99 of it
	} {
		var o occupancy
		for i, p := range [][3]float64{{745.5, 890.1, 81.5}, {745.5, 890.3, 48.8}} {
			o.pre[0][i], o.pre[1][i], o.pre[2][i] = ms(p[0]), ms(p[1]), ms(p[2])
		}
		o.nPre = 2
		point := 35200 * time.Microsecond
		e := occEntry{arrive: ms(208), first: ms(c.first), pb: ms(c.pb)}
		end, _ := o.lockEnd(e, ms(745.5), leastWait(point), point)
		require.Equal(t, ms(c.want), end, "%s: start under the lock %.1f ms", c.name, float64(end)/1e6)
	}
}

// TestLockEndTailBatchJoin: quiet ollama P=2 hint 2, s8run01, request 8
// (612 prompt tokens, two batches by its estimate: 107 ms, 91.5 its first)
// came 0.4 ms after its holder (609.0–928.4 ms, 152.4 estimated, 91.5 its
// first batch), which ran past its time alone: the request joined it at its
// first batch's end (700.5 ms; the engine's slot 709.9) and its first
// output trails the holder's by its own tail, 26.9 ms for 15.5. That is
// less than its least wait, so the join was not taken and it was placed at
// the holder's start, 100 ms short (tailBatchJoin). A one-batch prompt
// with the same first output, one within endTolerance of the holder's (it
// shared every batch), or one less than its tail after it (a third batch
// of its own) stays.
func TestLockEndTailBatchJoin(t *testing.T) {
	ms := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
	for _, c := range []struct {
		name      string
		first, pb float64
		want      float64
	}{
		{"two batches, its tail after the holder's", 955.3, 91.5, 700.5},
		{"two batches, at the band's lower end", 940.4, 91.5, 700.5}, // 12.0 ms: 1/pointHigh of 15.5 is 11.9
		{"two batches, with the holder's", 932.4, 91.5, 609.4},       // 4 ms: within endTolerance
		{"two batches, under the band", 939.4, 91.5, 609.4},          // 11 ms: short of its tail (a third batch)
		{"one batch", 955.3, 0, 609.4},
	} {
		var o occupancy
		o.pre[0][0], o.pre[1][0], o.pre[2][0], o.pre[3][0] = ms(609.0), ms(928.4), ms(152.4), ms(91.5)
		o.nPre = 1
		point := 107 * time.Millisecond
		e := occEntry{arrive: ms(609.4), first: ms(c.first), pb: ms(c.pb)}
		end, solo := o.lockEnd(e, e.arrive, leastWait(point), point)
		require.Equal(t, ms(c.want), end, "%s: start under the lock %.1f ms", c.name, float64(end)/1e6)
		if c.want > 609.4 {
			// Its prefill from the join fits no estimate: the join is its
			// "held" vote (joinedAt), as a first burst needs.
			require.Equal(t, lockHeld, lockVote(&o, e, e.arrive, end, solo, point, 0, false), c.name)
		}
	}
}
