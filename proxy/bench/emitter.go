package bench

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Emitter is the bench's upstream: an OpenAI-compatible endpoint on
// loopback that answers a streamed chat request with the number of events
// its max_tokens asks for, bench_gap_us apart, each stamped with its send
// time just before it is written, and a non-streamed one with a small JSON
// completion. It does no other work, so that what the clients measure
// through a proxy, minus what they measure direct, is the proxy.
//
// It can listen on several ports, one per target, so that what happens to
// a stream upstream is known by target.
//
// An Emitter is safe for concurrent use; Close stops it.
type Emitter struct {
	eventBytes int
	srv        *fasthttp.Server
	streams    sync.Pool
	wg         sync.WaitGroup

	mu      sync.Mutex
	addrs   []string
	cut     map[string]int64 // streams whose writing failed, by local address
	lastCut map[string]string
}

// NewEmitter starts an emitter on a loopback port. Events are eventBytes
// long (MinEventBytes at least).
func NewEmitter(eventBytes int) (*Emitter, error) {
	e := &Emitter{eventBytes: max(eventBytes, MinEventBytes), cut: map[string]int64{}, lastCut: map[string]string{}}
	e.streams.New = func() any { return &emitStream{ev: eventTemplate(e.eventBytes)} }
	e.srv = &fasthttp.Server{
		Handler:                      e.handle,
		Name:                         "anvilbench-emitter",
		NoDefaultDate:                true,
		NoDefaultServerHeader:        true,
		DisablePreParseMultipartForm: true,
		IdleTimeout:                  2 * time.Minute,
		ReadBufferSize:               8 << 10,
		CloseOnShutdown:              true,
	}
	if _, err := e.Listen(); err != nil {
		return nil, err
	}
	return e, nil
}

// Listen serves the emitter on one more loopback port and returns it.
func (e *Emitter) Listen() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("emitter: listening: %w", err)
	}
	e.mu.Lock()
	e.addrs = append(e.addrs, ln.Addr().String())
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		_ = e.srv.Serve(ln)
	}()
	return ln.Addr().String(), nil
}

// Addr is the emitter's first host:port.
func (e *Emitter) Addr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addrs[0]
}

// Close stops the emitter, cutting streams in progress.
func (e *Emitter) Close() error {
	err := e.srv.Shutdown()
	e.wg.Wait()
	return err
}

// Cut returns the number of streams served on addr that the emitter could
// not write to their end (the peer closed the connection), and the last
// such error.
func (e *Emitter) Cut(addr string) (int64, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cut[addr], e.lastCut[addr]
}

func (e *Emitter) handle(ctx *fasthttp.RequestCtx) {
	body := ctx.PostBody()
	if !bytes.Contains(body, []byte(`"stream":true`)) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(smallResponse)
		return
	}
	events := intField(body, `"max_tokens":`)
	gap := intField(body, `"bench_gap_us":`)
	if events < 0 || gap < 0 {
		ctx.Error("bench emitter: max_tokens and bench_gap_us are required", fasthttp.StatusBadRequest)
		return
	}
	s := e.streams.Get().(*emitStream)
	s.pool = &e.streams
	s.e = e
	s.local = ctx.LocalAddr().String()
	s.events = int(events)
	s.gap = time.Duration(gap) * time.Microsecond
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.SetBodyStream(s, -1)
}

// emitStream writes one stream's events. fasthttp frames each Write as one
// chunk and flushes it (BodyWriterTo), so an event leaves in one write(2)
// right after it is stamped; the status line and headers go out with the
// first event.
type emitStream struct {
	e      *Emitter
	local  string // the emitter address the stream was asked on
	pool   *sync.Pool
	ev     []byte
	tail   []byte
	events int
	gap    time.Duration
}

var (
	_ fasthttp.BodyWriterTo        = (*emitStream)(nil)
	_ fasthttp.ReadCloserWithError = (*emitStream)(nil)
)

func (s *emitStream) SupportsBodyWriteTo() bool { return true }

// WriteTo sends the events on a fixed schedule from the first one, so a
// late wakeup does not delay the ones after it.
func (s *emitStream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	start := time.Now()
	for i := range s.events {
		if i > 0 {
			if d := time.Until(start.Add(time.Duration(i) * s.gap)); d > 0 {
				time.Sleep(d)
			}
		}
		stampEvent(s.ev, uint64(i), now())
		n, err := w.Write(s.ev)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	s.tail = appendFinish(s.tail[:0], s.events)
	n, err := w.Write(s.tail)
	return total + int64(n), err
}

// Read is never used: fasthttp calls WriteTo. It ends the body at once.
func (s *emitStream) Read([]byte) (int, error) { return 0, io.EOF }

// CloseWithError is called once, when fasthttp is done with the body, with
// the error that cut it short if any.
func (s *emitStream) CloseWithError(err error) error {
	if err != nil {
		s.e.mu.Lock()
		s.e.cut[s.local]++
		s.e.lastCut[s.local] = err.Error()
		s.e.mu.Unlock()
	}
	p := s.pool
	s.pool = nil
	p.Put(s)
	return nil
}
