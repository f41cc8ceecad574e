package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// protocol renders one request's engine events in one API's wire format.
// A protocol value serves a single request; parse binds it to its job.
type protocol interface {
	// prefix is the response id prefix, such as "chatcmpl-".
	prefix() string
	// parse fills j's prompt, token limit, reasoning and stream fields.
	parse(body []byte, j *job) error
	// open writes the events that precede the first output event.
	open(e *eventWriter, res *result) error
	// delta writes one output event.
	delta(e *eventWriter, res *result, d delta) error
	// close writes the events after the last output event.
	close(e *eventWriter, res *result) error
	// body is the whole non-stream response.
	body(res *result) any
	// errorBody is the JSON body of an error answer.
	errorBody(status int, msg string) any
}

func (s *Server) generation(newProtocol func(*Server) protocol) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.serveGeneration(w, r, newProtocol(s))
	}
}

// serveGeneration is the life of one generation request: read, parse,
// injected faults, admission, engine, response.
func (s *Server) serveGeneration(w http.ResponseWriter, r *http.Request, p protocol) {
	s.mu.Lock()
	s.stats.Requests++
	s.mu.Unlock()
	arrived := time.Now()
	// Reading the body to EOF also starts net/http's background read, which
	// is what cancels r.Context() when the client closes the connection.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		status := http.StatusBadRequest
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			status = http.StatusRequestEntityTooLarge
		}
		s.reject(w, p, status, fmt.Sprintf("reading request body: %v", err))
		return
	}
	j, err := s.newJob(r, body, p, arrived)
	if err != nil {
		s.reject(w, p, http.StatusBadRequest, err.Error())
		return
	}
	if v := r.Header.Get("X-Request-Id"); v != "" {
		w.Header().Set("X-Request-Id", v)
	}
	if status, msg := s.fault(j); status != 0 {
		s.reject(w, p, status, msg)
		return
	}
	j.hashes = s.cache.hashes(j.prompt)
	j.promptTokens = max(1, len(j.prompt)/s.cfg.BytesPerToken)
	kv := j.promptTokens + j.maxTokens
	if s.cfg.KVCacheTokens > 0 && kv > s.cfg.KVCacheTokens {
		s.reject(w, p, http.StatusBadRequest,
			fmt.Sprintf("sim: prompt and completion (%d tokens) exceed the KV cache (%d tokens)", kv, s.cfg.KVCacheTokens))
		return
	}
	s.jitterArrival()
	j.enqueued = time.Now()
	t, ok := s.enqueue(j.hashes, kv)
	if !ok {
		s.reject(w, p, http.StatusTooManyRequests,
			fmt.Sprintf("sim: queue full: %d requests wait for %d slots", s.cfg.MaxQueue, s.cfg.Slots))
		return
	}

	// A stream's head leaves when Config.Head says (run sends it); a
	// whole response's with its body.
	var out output = unaryOutput{w: w, p: p, j: j, tgi: s.cfg.TGIHeaders}
	if j.stream {
		out = &streamOutput{w: w, p: p}
	}
	res, err := s.run(r.Context(), t, j, out)
	switch {
	case errors.Is(err, errInjected):
		s.record(j, res, OutcomeFailed)
		s.count(&s.stats.Failed)
		// The stdlib way to drop a response mid-body: no terminating chunk is
		// written, so the client sees an unexpected EOF (as Go's
		// ReverseProxy does when its upstream dies).
		panic(http.ErrAbortHandler)
	case errors.Is(err, errTruncated):
		// Returning ends the chunked body cleanly: HTTP 200, no finish, no
		// usage, no [DONE] or closing events, as ollama's streams end when
		// it stops a generation for repetition.
		s.record(j, res, OutcomeTruncated)
		s.count(&s.stats.Truncated)
	case err != nil:
		s.record(j, res, OutcomeAborted)
	default:
		s.record(j, res, OutcomeCompleted)
		s.count(&s.stats.Completed)
	}
}

// reject answers an error status with p's error body.
func (s *Server) reject(w http.ResponseWriter, p protocol, status int, msg string) {
	if status == http.StatusTooManyRequests {
		s.count(&s.stats.Rejected429)
	} else {
		s.count(&s.stats.Failed)
	}
	writeJSON(w, status, p.errorBody(status, msg)) // a failed write leaves nothing to do
}

func (s *Server) count(c *int64) {
	s.mu.Lock()
	*c++
	s.mu.Unlock()
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		panic("BUG: sim response does not marshal: " + err.Error())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("writing client: %w", err)
	}
	return nil
}

// eventWriter writes Server-Sent Events to a client.
type eventWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

// startStream sends a stream's head with Content-Type ct.
func startStream(w http.ResponseWriter, ct string) *eventWriter {
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	e := &eventWriter{w: w, rc: http.NewResponseController(w)}
	// A failed flush means the client is gone; the engine notices through
	// the request context before it does any work.
	e.rc.Flush()
	return e
}

// send writes one event, with an "event:" line when name is not empty, and
// flushes it.
func (e *eventWriter) send(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		panic("BUG: sim event does not marshal: " + err.Error())
	}
	e.buf = e.buf[:0]
	if name != "" {
		e.buf = append(e.buf, "event: "...)
		e.buf = append(e.buf, name...)
		e.buf = append(e.buf, '\n')
	}
	e.buf = append(e.buf, "data: "...)
	e.buf = append(e.buf, b...)
	e.buf = append(e.buf, "\n\n"...)
	return e.flush()
}

// line writes one NDJSON line (ollama's native stream) and flushes it.
func (e *eventWriter) line(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		panic("BUG: sim line does not marshal: " + err.Error())
	}
	e.buf = append(append(e.buf[:0], b...), '\n')
	return e.flush()
}

// done writes the OpenAI end-of-stream sentinel.
func (e *eventWriter) done() error {
	e.buf = append(e.buf[:0], "data: [DONE]\n\n"...)
	return e.flush()
}

// flush writes and flushes e.buf. Every event is flushed on its own: the
// proxy under test times each event as it arrives, and buffering would
// merge events and distort TTFT and inter-event gaps.
func (e *eventWriter) flush() error {
	if _, err := e.w.Write(e.buf); err != nil {
		return fmt.Errorf("writing client: %w", err)
	}
	if err := e.rc.Flush(); err != nil {
		return fmt.Errorf("flushing client: %w", err)
	}
	return nil
}

// streamType is the Content-Type of p's streams: text/event-stream, or
// what a protocol of another framing says (ollama's NDJSON).
func streamType(p protocol) string {
	if t, ok := p.(interface{ contentType() string }); ok {
		return t.contentType()
	}
	return "text/event-stream; charset=utf-8"
}

// streamOutput sends the engine's events to a stream through a protocol.
// It is owned by the request's handler goroutine.
type streamOutput struct {
	w http.ResponseWriter
	p protocol
	e *eventWriter // nil until the head is sent
}

func (o *streamOutput) head(res *result) {
	if o.e == nil {
		o.e = startStream(o.w, streamType(o.p))
		res.head = time.Now()
	}
}

// start sends the head if it has not left yet (HeadFirstOutput), then the
// opening events; they and the first output event leave at one instant.
func (o *streamOutput) start(res *result) error {
	o.head(res)
	return o.p.open(o.e, res)
}

func (o *streamOutput) token(res *result, d delta) error { return o.p.delta(o.e, res, d) }

func (o *streamOutput) end(res *result) error {
	o.head(res)
	return o.p.close(o.e, res)
}

// jitterArrival waits a random time below Config.ArrivalJitter, so that
// requests arriving within it reach the queue in random order.
func (s *Server) jitterArrival() {
	if s.cfg.ArrivalJitter <= 0 {
		return
	}
	s.mu.Lock()
	d := time.Duration(s.jitter.Int64N(int64(s.cfg.ArrivalJitter)))
	s.mu.Unlock()
	time.Sleep(d)
}
