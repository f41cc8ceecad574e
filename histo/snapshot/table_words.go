package snapshot

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
)

// The report's words for counts, spans and ratios: "failed" and its
// classes as histo/failures.go defines them, the time the windows really
// cover, and which cache-hit ratio is meant.

// failedText is "13 failed (7 abandoned, 6 refused)": the classes of the
// failures the document lists (all of them unless the record cap dropped
// some, which it then says).
func failedText(doc *Document) string {
	out := fmt.Sprintf("%d failed", doc.Failed)
	if doc.Failed == 0 || len(doc.Failures) == 0 {
		return out
	}
	counts := map[string]int64{}
	for _, raw := range doc.Failures {
		var f struct {
			Status    *int64  `json:"status"`
			ErrorKind *string `json:"error_kind"`
		}
		if json.Unmarshal(raw, &f) != nil {
			continue
		}
		status, kind := 0, ""
		if f.Status != nil {
			status = int(*f.Status)
		}
		if f.ErrorKind != nil {
			kind = *f.ErrorKind
		}
		counts[histo.FailureClass(status, kind)]++
	}
	var parts []string
	for _, c := range []struct{ class, name string }{
		{histo.FailureAbandoned, "abandoned"}, {histo.FailureRefused, "refused"}, {histo.FailureError, "error"},
	} {
		n := counts[c.class]
		switch {
		case n == 0:
		case c.class == histo.FailureError:
			parts = append(parts, Plural(n, c.name))
		default:
			parts = append(parts, fmt.Sprintf("%d %s", n, c.name))
		}
	}
	if len(parts) == 0 {
		return out
	}
	of := ""
	if int64(len(doc.Failures)) < doc.Failed {
		of = fmt.Sprintf("of the %d listed: ", len(doc.Failures))
	}
	return out + " (" + of + strings.Join(parts, ", ") + ")"
}

// Plural is "1 request", "2 requests", "1 retry", "3 retries": the count
// with its noun, for every line a person reads.
func Plural(n int64, word string) string {
	if n == 1 {
		return "1 " + word
	}
	if strings.HasSuffix(word, "y") && !strings.HasSuffix(word, "ay") {
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(word, "y"))
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// retriesText is ", 12 retries" from the retry section; "" without one.
func retriesText(ext *Extension) string {
	rs, err := section[histo.RetrySection](ext.Retry, "retry")
	if err != nil || rs == nil {
		return ""
	}
	return ", " + Plural(rs.Retries, "retry")
}

// spanText is the measured time: the windows' own spans (WallClockMs,
// which throughput divides by), with the first and last instants, and the
// time between them when gaps make it longer (a window with no request
// writes no file, and separate runs leave time between them).
func spanText(doc *Document, ext *Extension) string {
	between := time.Duration(doc.FinishedAtUnixNs - doc.StartedAtUnixNs)
	covered := between
	if doc.WallClockMs.Known() {
		covered = time.Duration(float64(doc.WallClockMs) * float64(time.Millisecond))
	}
	windows := Plural(ext.Windows, "window")
	out := fmt.Sprintf("%s covering %s, %s to %s", windows, covered.Round(100*time.Millisecond), doc.StartedAt, doc.FinishedAt)
	if between-covered >= time.Second {
		out += fmt.Sprintf(" (%s apart: no file covers the rest)", between.Round(100*time.Millisecond))
	}
	return out
}

// cacheHitText is the prefix-cache hit rate, token-weighted (cached
// prompt tokens / prompt tokens) when the request records cover every
// request, beside the mean of per-request ratios, the v1 schema's
// prefix_cache_hit_avg; each says which it is.
func cacheHitText(doc *Document, ext *Extension) string {
	mean := percent(metricNum(doc.Metrics["prefix_cache_hit_avg"]))
	var cached, prompt, n int64
	for _, t := range doc.RequestTimings {
		if t.PromptTokens > 0 && t.CachedTokens >= 0 {
			cached += int64(t.CachedTokens)
			prompt += int64(t.PromptTokens)
			n++
		}
	}
	if prompt == 0 || ext.DroppedRecords > 0 {
		return fmt.Sprintf("%s of prompt tokens, as a mean of per-request ratios over %s", mean, Plural(ext.PrefixCacheHitSamples, "request"))
	}
	return fmt.Sprintf("%s of prompt tokens (token-weighted over %s; mean of per-request ratios %s)",
		percent(Num(float64(cached)/float64(prompt))), Plural(n, "request"), mean)
}
