package retry

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRetriesAfter429 is the SDK's backoff loop: two 429s, then a success.
// The OpenAI and Anthropic SDKs number their retries in
// X-Stainless-Retry-Count; a plain client is found by body alone.
func TestRetriesAfter429(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers [3]int
	}{
		{"sdk header", [3]int{0, 1, 2}},
		{"no header", [3]int{-1, -1, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, clk := newTest(t, Config{})
			gaps := [3]time.Duration{0, 800 * time.Millisecond, 1700 * time.Millisecond}
			var got [3]Result
			for i := range got {
				clk.advance(gaps[i])
				got[i] = tr.Begin(req(`{"model":"m","messages":[]}`, tc.headers[i]))
				clk.advance(150 * time.Millisecond)
				o := status(429)
				if i == 2 {
					o = Outcome{Status: 200, FirstTokenSeen: true, PromptTokens: 40, CompletionTokens: 9}
				}
				tr.End(&got[i], o)
			}
			id, byHeader := got[0].ClientID, tc.headers[1] > 0
			require.Equal(t, Result{ClientID: id, LogicalID: 1, Gap: GapUnknown, SincePrev: GapUnknown}, public(got[0]))
			for i := 1; i < 3; i++ {
				require.Equal(t, Result{ClientID: id, LogicalID: 1, Attempt: i, Retry: true, ByHeader: byHeader,
					PrevOutcome: Ending429, Gap: gaps[i], SincePrev: gaps[i] + 150*time.Millisecond}, public(got[i]))
			}
			s := tr.Stats()
			require.EqualValues(t, 3, s.Attempts)
			require.EqualValues(t, 1, s.Logical)
			require.EqualValues(t, 2, s.Retries)
			require.EqualValues(t, 2, s.RetriesBy[Ending429])
			require.Equal(t, 3.0, s.Amplification)
			require.Zero(t, s.WastedPrompt+s.WastedCompletion, "429 wastes nothing")
			if byHeader {
				require.EqualValues(t, 2, s.ByHeader)
			}
		})
	}
}

// TestHeaderWithoutHistory: a retry whose earlier attempts the Tracker
// never saw is still a retry, of an unknown outcome, and it links later
// retries.
func TestHeaderWithoutHistory(t *testing.T) {
	tr, clk := newTest(t, Config{})
	r2 := tr.Begin(req("b", 2))
	require.Equal(t, Result{ClientID: r2.ClientID, LogicalID: 1, Attempt: 2, Retry: true, ByHeader: true,
		PrevOutcome: EndingUnknown, Gap: GapUnknown, SincePrev: GapUnknown}, public(r2))
	clk.advance(time.Second)
	tr.End(&r2, status(503))
	clk.advance(2 * time.Second)
	r3 := tr.Begin(req("b", 3))
	require.Equal(t, Result{ClientID: r2.ClientID, LogicalID: 1, Attempt: 3, Retry: true, ByHeader: true,
		PrevOutcome: Ending5xx, Gap: 2 * time.Second, SincePrev: 3 * time.Second}, public(r3))

	// Without a body there is nothing to link by.
	r := tr.Begin(req("", 1))
	require.Equal(t, EndingUnknown, r.PrevOutcome)
	require.EqualValues(t, 2, r.LogicalID)
	s := tr.Stats()
	require.EqualValues(t, 2, s.Logical)
	require.EqualValues(t, 2, s.RetriesBy[EndingUnknown])
}

// TestAppRetryAroundSDK: an application retrying around an SDK restarts the
// header at 0; the body still links it (nanobot #2760: stacked retries).
func TestAppRetryAroundSDK(t *testing.T) {
	tr, _ := newTest(t, Config{})
	var last Result
	for _, h := range []int{0, 1, 2, 0, 1, 2} {
		last = tr.Begin(req("b", h))
		tr.End(&last, status(429))
	}
	require.Equal(t, 5, last.Attempt)
	s := tr.Stats()
	require.EqualValues(t, 6, s.Attempts)
	require.EqualValues(t, 1, s.Logical)
	require.EqualValues(t, 4, s.ByHeader)
}

// TestPlainClientTimeout: a client without the SDK header times out and
// sends the same body again. The proxy sees either the abort or, while it
// still waits on the engine, nothing yet.
func TestPlainClientTimeout(t *testing.T) {
	t.Run("abort seen", func(t *testing.T) {
		tr, clk := newTest(t, Config{})
		p := tr.Begin(req("b", -1))
		clk.advance(60 * time.Second)
		tr.End(&p, Outcome{ClientAbort: true, PromptTokens: 1200, CompletionTokens: -1})
		clk.advance(2 * time.Second)
		r := tr.Begin(req("b", -1))
		require.Equal(t, Result{ClientID: p.ClientID, LogicalID: 1, Attempt: 1, Retry: true,
			PrevOutcome: EndingClientAbortBeforeFirstToken, Gap: 2 * time.Second, SincePrev: 62 * time.Second,
			WastedPrompt: 1200}, public(r))
	})
	t.Run("in flight", func(t *testing.T) {
		tr, clk := newTest(t, Config{})
		p := tr.Begin(req("b", -1))
		clk.advance(DefaultWindow + time.Second) // past the SDK default timeout of 600 s, still in flight
		r := tr.Begin(req("b", -1))
		require.Equal(t, Result{ClientID: p.ClientID, LogicalID: 1, Attempt: 1, Retry: true,
			PrevOutcome: EndingInFlight, Gap: GapUnknown, SincePrev: DefaultWindow + time.Second}, public(r))
		clk.advance(time.Second)
		// The overtaken attempt completes for nobody: its work is charged to it.
		tr.End(&p, Outcome{Status: 200, FirstTokenSeen: true, PromptTokens: 300, CompletionTokens: 50})
		require.EqualValues(t, 300, p.WastedPrompt)
		require.EqualValues(t, 50, p.WastedCompletion)
		tr.End(&r, Outcome{Status: 200, FirstTokenSeen: true, PromptTokens: 300, CompletionTokens: 50})
		require.Zero(t, r.WastedPrompt+r.WastedCompletion)
		s := tr.Stats()
		require.EqualValues(t, 300, s.WastedPrompt)
		require.EqualValues(t, 50, s.WastedCompletion)
		require.EqualValues(t, 1, s.RetriesBy[EndingInFlight])
	})
}

// TestNotRetries: what must start a new logical request.
func TestNotRetries(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first Request
		wait  time.Duration
	}{
		{"other body", req("b2", -1), 0},
		{"other auth", func() Request { r := req("b", -1); r.Auth = []byte("Bearer sk-other"); return r }(), 0},
		{"other api key", func() Request { r := req("b", -1); r.APIKey = []byte("ak"); return r }(), 0},
		{"other ip", func() Request { r := req("b", -1); r.RemoteIP = []byte{10, 0, 0, 8}; return r }(), 0},
		{"other user agent", func() Request { r := req("b", -1); r.UserAgent = []byte("curl/8"); return r }(), 0},
		{"field boundary", func() Request { r := req("b", -1); r.Auth, r.APIKey = r.Auth[:7], r.Auth[7:]; return r }(), 0},
		{"after the window", req("b", -1), DefaultWindow + time.Nanosecond},
		{"empty body", req("", -1), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, clk := newTest(t, Config{})
			p := tr.Begin(tc.first)
			tr.End(&p, status(200))
			clk.advance(tc.wait)
			r := tr.Begin(req(map[bool]string{true: "", false: "b"}[tc.name == "empty body"], -1))
			require.False(t, r.Retry)
			require.Equal(t, EndingNone, r.PrevOutcome)
			require.NotEqual(t, p.LogicalID, r.LogicalID)
			require.EqualValues(t, 2, tr.Stats().Logical)
		})
	}
}

// TestSameClient: what must not split a client.
func TestSameClient(t *testing.T) {
	tr, clk := newTest(t, Config{})
	p := tr.Begin(req("b", -1))
	tr.End(&p, status(502))
	clk.advance(DefaultWindow) // exactly the window: still in
	r := req("b", -1)
	r.RemoteIP = []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7} // the same IPv4, 16-byte form
	res := tr.Begin(r)
	require.True(t, res.Retry)
	require.Equal(t, p.ClientID, res.ClientID)
	require.Equal(t, Ending5xx, res.PrevOutcome)
	require.Equal(t, DefaultWindow, res.Gap)
}

// TestWaste is the waste rule for each way the previous attempt can end,
// charged to the retry at Begin, plus a duplicate charged at its own End.
func TestWaste(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prev       Outcome
		want       Ending
		wantP      int64
		wantC      int64
		dupP, dupC int64 // charged at the retry's End
	}{
		{"abort mid-stream", Outcome{ClientAbort: true, FirstTokenSeen: true, PromptTokens: 500, CompletionTokens: 200},
			EndingClientAbortMidStream, 500, 200, 0, 0},
		{"abort before first token, prompt unknown", Outcome{ClientAbort: true, PromptTokens: -1, CompletionTokens: -1},
			EndingClientAbortBeforeFirstToken, 0, 0, 0, 0},
		{"broken stream", Outcome{Status: 200, UpstreamError: true, FirstTokenSeen: true, PromptTokens: 500, CompletionTokens: 30},
			Ending5xx, 500, 30, 0, 0},
		{"timeout mid-stream", Outcome{Status: 504, UpstreamTimeout: true, FirstTokenSeen: true, PromptTokens: 500, CompletionTokens: 30},
			EndingUpstreamTimeout, 500, 30, 0, 0},
		{"5xx before first token", Outcome{Status: 500, PromptTokens: 500, CompletionTokens: -1}, Ending5xx, 0, 0, 0, 0},
		{"429", Outcome{Status: 429, PromptTokens: 500}, Ending429, 0, 0, 0, 0},
		{"400", Outcome{Status: 400}, EndingOther4xx, 0, 0, 0, 0},
		{"success: the retry is the waste", Outcome{Status: 200, FirstTokenSeen: true, PromptTokens: 500, CompletionTokens: 80},
			EndingSuccess, 0, 0, 510, 90},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, clk := newTest(t, Config{})
			p := tr.Begin(req("b", -1))
			clk.advance(time.Second)
			tr.End(&p, tc.prev)
			require.Zero(t, p.WastedPrompt+p.WastedCompletion)
			r := tr.Begin(req("b", -1))
			require.Equal(t, tc.want, r.PrevOutcome)
			require.Equal(t, [2]int64{tc.wantP, tc.wantC}, [2]int64{r.WastedPrompt, r.WastedCompletion})
			tr.End(&r, Outcome{Status: 200, FirstTokenSeen: true, PromptTokens: 510, CompletionTokens: 90})
			require.Equal(t, [2]int64{tc.wantP + tc.dupP, tc.wantC + tc.dupC}, [2]int64{r.WastedPrompt, r.WastedCompletion})
			s := tr.Stats()
			require.Equal(t, [2]int64{tc.wantP + tc.dupP, tc.wantC + tc.dupC}, [2]int64{s.WastedPrompt, s.WastedCompletion})
			require.Equal(t, tc.wantP+tc.dupP+tc.wantC+tc.dupC, tr.TopClients(1)[0].WastedTokens)
		})
	}
}

// TestWasteChargedOnce: an aborted duplicate is charged at its End, not
// again by the retry after it; a second End is ignored.
func TestWasteChargedOnce(t *testing.T) {
	tr, _ := newTest(t, Config{})
	p := tr.Begin(req("b", -1))
	tr.End(&p, Outcome{Status: 200, PromptTokens: 10, CompletionTokens: 5})
	d := tr.Begin(req("b", -1))
	abort := Outcome{ClientAbort: true, FirstTokenSeen: true, PromptTokens: 10, CompletionTokens: 3}
	tr.End(&d, abort)
	tr.End(&d, abort)
	r := tr.Begin(req("b", -1))
	require.Equal(t, EndingClientAbortMidStream, r.PrevOutcome)
	require.Zero(t, r.WastedPrompt+r.WastedCompletion)
	s := tr.Stats()
	require.Equal(t, [2]int64{10, 3}, [2]int64{s.WastedPrompt, s.WastedCompletion})

	var zero Result
	tr.End(&zero, abort) // not from Begin: ignored
	require.Equal(t, s, tr.Stats())
}

func TestEnding(t *testing.T) {
	for _, tc := range []struct {
		o    Outcome
		want Ending
	}{
		{Outcome{Status: 200}, EndingSuccess},
		{Outcome{Status: 204}, EndingSuccess},
		{Outcome{Status: 429}, Ending429},
		{Outcome{Status: 503}, Ending5xx},
		{Outcome{Status: 200, UpstreamError: true}, Ending5xx},
		{Outcome{Status: 504, UpstreamTimeout: true}, EndingUpstreamTimeout},
		{Outcome{Status: 499, ClientAbort: true}, EndingClientAbortBeforeFirstToken},
		{Outcome{Status: 200, ClientAbort: true, FirstTokenSeen: true}, EndingClientAbortMidStream},
		{Outcome{Status: 404}, EndingOther4xx},
		{Outcome{Status: 302}, EndingUnknown},
		{Outcome{}, EndingUnknown},
	} {
		t.Run(tc.want.String(), func(t *testing.T) { require.Equal(t, tc.want, tc.o.ending()) })
	}
	require.Equal(t, "in_flight", EndingInFlight.String())
	require.Equal(t, "unknown", Ending(200).String())
}

func TestParseRetryCount(t *testing.T) {
	for in, want := range map[string]int{"": -1, "0": 0, "1": 1, "12": 12, "-1": -1, " 1": -1, "x": -1, "9999999": -1} {
		require.Equal(t, want, ParseRetryCount([]byte(in)), in)
	}
}

func TestClientIDString(t *testing.T) {
	require.Equal(t, "00000000000000ff", ClientID(255).String())
	b, err := ClientID(1<<64 - 1).MarshalText()
	require.NoError(t, err)
	require.Equal(t, "ffffffffffffffff", string(b))
}
