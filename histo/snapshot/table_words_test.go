package snapshot

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/retry"
)

// TestReportWords checks the report's first lines: failed with its
// classes and the retries beside it, the span the windows really cover
// when a window is missing, and the cache hit rate token-weighted beside
// the mean of per-request ratios.
func TestReportWords(t *testing.T) {
	docAt := func(start time.Time, from, to int, fail func(i int, tr *proxy.Trace)) *Document {
		r, clk := newRecorder(t, histo.Config{})
		clk.t = start
		r.Rotate()
		for i := from; i < to; i++ {
			tr := trace(i)
			tr.Recv = start.Add(time.Duration(i-from) * time.Second)
			fail(i, &tr)
			r.Record(&tr)
		}
		clk.t = start.Add(time.Minute)
		return roundTrip(t, build(t, r.Rotate()))
	}
	fail := func(i int, tr *proxy.Trace) {
		switch i % 10 {
		case 1:
			tr.ErrSide, tr.ErrKind, tr.Status = proxy.SideClient, proxy.ErrClientGone, proxy.StatusClientClosed
		case 2:
			tr.Status = 429
		case 3:
			tr.ErrSide, tr.ErrKind, tr.Truncated = proxy.SideUpstream, proxy.ErrUpstreamBroken, true
		case 4:
			tr.Retry = retry.Result{LogicalID: uint64(i), Attempt: 1, Retry: true, PrevOutcome: retry.Ending429}
		}
	}
	// Two windows with a minute between them that wrote no file.
	a := docAt(t0, 0, 20, fail)
	b := docAt(t0.Add(2*time.Minute), 20, 30, fail)
	merged, err := Merge(a, b)
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, WriteTable(&out, merged))
	for _, l := range strings.Split(out.String(), "\n") {
		require.LessOrEqual(t, utf8.RuneCountInString(l), ReportWidth, l)
	}
	// The checks below read the lines as if unwrapped.
	text := regexp.MustCompile(`\n +`).ReplaceAllString(out.String(), " ")
	first := text[:strings.IndexByte(text, '\n')]
	require.Equal(t, "30 requests: 21 completed, 9 failed (3 abandoned, 3 refused, 3 errors), 3 retries; 2 windows covering 2m0s, "+
		merged.StartedAt+" to "+merged.FinishedAt+" (3m0s apart: no file covers the rest)", first)

	var cached, prompt int64
	var sum float64
	for _, tm := range merged.RequestTimings {
		cached += int64(tm.CachedTokens)
		prompt += int64(tm.PromptTokens)
		sum += float64(tm.CachedTokens) / float64(tm.PromptTokens)
	}
	require.Contains(t, text, fmt.Sprintf("cache hit   engine-reported %.1f%% of prompt tokens (token-weighted over 21 requests; mean of per-request ratios %.1f%%); inferred from prefill time ",
		100*float64(cached)/float64(prompt), 100*sum/21))
}

func TestGroupReasons(t *testing.T) {
	require.Equal(t, []string{
		"cpu pressure up to 70.2% > 10% (3 windows)",
		"timer overshoot p99 3.1 ms > 2 ms",
		"memory pressure up to 12.5% > 10% (2 windows)",
		"the self-check probe did not run in this window",
	}, groupReasons([]string{
		"cpu pressure 57.1% > 10%", "timer overshoot p99 3.1 ms > 2 ms", "cpu pressure 70.2% > 10%",
		"memory pressure 11% > 10%", "cpu pressure 12% > 10%", "memory pressure 12.5% > 10%",
		"the self-check probe did not run in this window", "the self-check probe did not run in this window",
	}))
}

// TestPlural: the report's counts agree with their nouns (issue 27, 9).
func TestPlural(t *testing.T) {
	require.Equal(t, "1 request", Plural(1, "request"))
	require.Equal(t, "0 requests", Plural(0, "request"))
	require.Equal(t, "1 retry", Plural(1, "retry"))
	require.Equal(t, "2 retries", Plural(2, "retry"))
	require.Equal(t, "1 error", Plural(1, "error"))
	require.Equal(t, "4 slots", Plural(4, "slot"))
}

// TestWrapLines: a long line breaks at a clause and continues under its
// label; a short one is untouched.
func TestWrapLines(t *testing.T) {
	long := "cache hit   engine-reported 57.6% of prompt tokens (token-weighted over 63 requests; mean of per-request ratios 58.1%); inferred from prefill time -"
	got := wrapLines(long+"\nshort line\n", 100)
	require.Equal(t, "cache hit   engine-reported 57.6% of prompt tokens (token-weighted over 63 requests;\n"+
		"            mean of per-request ratios 58.1%); inferred from prefill time -\nshort line\n", got)
	require.Equal(t, strings.Repeat("x", 120), wrapLines(strings.Repeat("x", 120), 100), "one word stays whole")
}
