package retry

import (
	"sync"
	"testing"
	"time"
)

// clock is an injectable Config.Now, safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTest(tb testing.TB, cfg Config) (*Tracker, *clock) {
	tb.Helper()
	c := newClock()
	cfg.Now = c.now
	return New(cfg), c
}

// req is a request from the default test client.
func req(body string, header int) Request {
	return Request{
		Auth:        []byte("Bearer sk-test"),
		RemoteIP:    []byte{10, 0, 0, 7},
		UserAgent:   []byte("OpenAI/Go 3.0.0"),
		Body:        []byte(body),
		RetryHeader: header,
	}
}

// public is r without its unexported fields, for whole-value comparisons.
func public(r Result) Result {
	r.key, r.seq, r.ended = entryKey{}, 0, false
	return r
}

func status(code int) Outcome { return Outcome{Status: code, PromptTokens: -1, CompletionTokens: -1} }
