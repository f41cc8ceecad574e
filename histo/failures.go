package histo

// The words for how requests end, defined once for the live table (demo,
// top), the demo's summary, "anvilproxy report" and the dashboard:
//
//   - a request is one attempt on an inference route (chat, completions,
//     responses, messages), as the proxy received it: a client's retry is a
//     request of its own;
//   - a request failed when it did not deliver a whole answer to its client
//     (proxy.Trace.Failed): an error status, a broken or truncated stream,
//     or the client going away first; every other request completed;
//   - a failed request is abandoned when the client went away before the
//     end (error kind client_gone: an impatient agent, a timeout, Ctrl-C),
//     refused when it was answered 429 or 503 (the engine or the proxy's
//     limits turned it away), and an error otherwise;
//   - a retry is a request the retry tracker found to repeat an earlier
//     one of the same client (retry_attempt > 0), whatever became of it.
//
// So "120 requests, 13 failed (7 abandoned, 6 refused), 12 retries" counts
// attempts throughout; the agents' view (turns answered, turns given up)
// is another count, and is labelled as such.

// Failure classes of a failed request.
const (
	FailureAbandoned = "abandoned"
	FailureRefused   = "refused"
	FailureError     = "error"
)

// FailureClass classifies a failed request by the status sent to the
// client and its error kind (proxy.ErrKind.String(); "" for none).
func FailureClass(status int, errKind string) string {
	switch {
	case errKind == "client_gone":
		return FailureAbandoned
	case status == 429 || status == 503:
		return FailureRefused
	}
	return FailureError
}
