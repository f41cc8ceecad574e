package histo

import (
	"encoding/json"
	"strconv"

	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// Records beyond inference, and the conversation of each record.
//
// /requests lists every request the proxy served, not only inference: an
// agent's probe of /v1/models or a path the engine does not know (a 404)
// is otherwise only a counter. Such a record has route, method, path,
// status, error and e2e; its phases, tokens, conversation and turn are
// null, and its request_index is -1: it belongs to no window, and it never
// reaches a snapshot, a histogram or goodput. Its path is proxy.Trace.Path:
// bounded, escaped, without the query string.

// ConvID names the conversation a request continues, as the prefix tracker
// found it (prefix.Result.ConversationID). It marshals to JSON as 16 hex
// digits, the form of the snapshot's conversations and drift events (a
// JSON number would lose bits in JavaScript), or null: 0 means untracked.
type ConvID uint64

// MarshalJSON writes the hex form or null.
func (c ConvID) MarshalJSON() ([]byte, error) {
	if c == 0 {
		return []byte("null"), nil
	}
	b := make([]byte, 0, 18)
	b = append(b, '"')
	s := strconv.FormatUint(uint64(c), 16)
	for range 16 - len(s) {
		b = append(b, '0')
	}
	b = append(b, s...)
	return append(b, '"'), nil
}

// UnmarshalJSON reads the hex form or null (0).
func (c *ConvID) UnmarshalJSON(b []byte) error {
	*c = 0
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := strconv.ParseUint(s, 16, 64)
	*c = ConvID(v)
	return err
}

// conversationOf is the request's conversation and turn (0 for the first
// request of a conversation); 0 and -1 (null) when it was not tracked.
func conversationOf(res *prefix.Result) (ConvID, Count) {
	if !res.Tracked {
		return 0, -1
	}
	return ConvID(res.ConversationID), Count(res.Turn)
}

// recordOther puts a request that is not inference into the recent ring.
func (r *Recorder) recordOther(tr *proxy.Trace) {
	var rq Request
	v := evalPhases(tr, &noSplit)
	newRequest(&rq, tr, noSplit, &v)
	rq.Index = -1
	rq.RetryAttempt = -1 // the retry tracker follows inference only
	r.mu.Lock()
	r.recent.put(&rq)
	r.mu.Unlock()
}
