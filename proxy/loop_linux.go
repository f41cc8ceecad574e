//go:build linux

package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// DefaultEventLoop is serve's --event-loop default on this platform (and
// the conformance stack's): on, since go test -race of proxy (-loop),
// cmd/anvilproxy and the real-engine conformance suite pass on the loop.
const DefaultEventLoop = true

// This file is the event-loop relay (docs/design.md "The event-loop relay"):
// once a streamed response's head is known, the stream's two sockets leave
// the connection's goroutine and one of a few loops relays it, touching it
// only when bytes arrive.

const (
	// loopRoom is kept free in front of each read for the chunk-size
	// line, so that a chunk goes out in one write without a copy.
	loopRoom = 16
	// loopTail is kept free after each read: the CRLF that ends a chunk
	// and the last chunk, 0 CRLF CRLF.
	loopTail = 2 + 5
	// loopEvents is how many epoll events one wait takes.
	loopEvents = 256
	// epollET is EPOLLET as the uint32 the event mask is (syscall's
	// constant is a negative int).
	epollET = 1 << 31
	// wakeSlot marks the loop's eventfd in an epoll event's data.
	wakeSlot = 1<<32 - 1
)

// lastChunk ends a chunked body to the client.
var lastChunk = []byte("0\r\n\r\n")

var (
	loopsOnce sync.Once
	loops     []*loop
	loopsErr  error
	loopNext  struct {
		sync.Mutex
		i int
	}
)

// theLoops returns the process's loops, one per GOMAXPROCS, started on
// first use and kept for the life of the process like the runtime's
// netpoller; nil if they cannot be created (out of descriptors).
func theLoops() []*loop {
	loopsOnce.Do(func() {
		n := runtime.GOMAXPROCS(0)
		for range n {
			l, err := newLoop()
			if err != nil {
				loopsErr = err
				return
			}
			loops = append(loops, l)
		}
		for _, l := range loops {
			go l.run()
		}
	})
	if loopsErr != nil {
		return nil
	}
	return loops
}

// nextLoop picks the loop for a new stream, round robin.
func nextLoop() *loop {
	ls := theLoops()
	if ls == nil {
		return nil
	}
	loopNext.Lock()
	loopNext.i++
	l := ls[loopNext.i%len(ls)]
	loopNext.Unlock()
	return l
}

// A loop relays the streams it owns: one goroutine waiting on one
// edge-triggered epoll set, one read buffer for all its streams. Only its
// goroutine touches streams, buf and free; inbox and abort are the ways in
// from other goroutines, under mu, followed by a wake.
type loop struct {
	epfd, evfd int
	file       *os.File        // epfd, registered with the runtime's netpoller
	rc         syscall.RawConn // file's, to wait in the netpoller
	buf        []byte          // every upstream read goes here: loopRoom + relayBufSize + loopTail
	frame      []byte          // the chunk being written when it is not built in buf in place
	streams    []*loopStream
	free       []uint32 // unused slots of streams
	active     int
	ended      bool          // a stream ended since the last yield (poll)
	gen        uint32        // the last registration's generation, so a stale event is ignored
	tick       time.Duration // the deadline scan's period while streams are active
	nextScan   time.Time
	armed      time.Time // the read deadline set on file: nextScan, or zero without streams
	evs        [loopEvents]syscall.EpollEvent

	mu     sync.Mutex
	inbox  []*loopStream
	aborts []*Proxy // proxies whose streams are to be cut (Proxy.Abort)
}

func newLoop() (*loop, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	r1, _, errno := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errno != 0 {
		syscall.Close(epfd)
		return nil, errno
	}
	evfd := int(r1)
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | epollET, Fd: -1} // wakeSlot
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		syscall.Close(epfd)
		syscall.Close(evfd)
		return nil, err
	}
	// The set is waited for in the runtime's netpoller (run): non-blocking,
	// so that os.NewFile registers it there.
	if err := syscall.SetNonblock(epfd, true); err != nil {
		syscall.Close(epfd)
		syscall.Close(evfd)
		return nil, err
	}
	f := os.NewFile(uintptr(epfd), "anvilproxy-loop")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		syscall.Close(evfd)
		return nil, err
	}
	return &loop{epfd: epfd, evfd: evfd, file: f, rc: rc, buf: make([]byte, loopRoom+relayBufSize+loopTail)}, nil
}

// wake makes the loop look at its inbox and aborts.
func (l *loop) wake() {
	one := [8]byte{1}
	_, _ = syscall.Write(l.evfd, one[:])
}

// add hands s to the loop; from any goroutine.
func (l *loop) add(s *loopStream) {
	l.mu.Lock()
	l.inbox = append(l.inbox, s)
	l.mu.Unlock()
	l.wake()
}

// abort cuts every stream of p the loop holds; from any goroutine.
func (l *loop) abort(p *Proxy) {
	l.mu.Lock()
	l.aborts = append(l.aborts, p)
	l.mu.Unlock()
	l.wake()
}

// abortLoops cuts every stream of p in a loop (Proxy.Abort).
func (p *Proxy) abortLoops() {
	if !p.cfg.EventLoop {
		return
	}
	for _, l := range theLoops() {
		l.abort(p)
	}
}

// run waits for the loop's events in the runtime's netpoller, not in a
// blocking epoll_wait: the loop's epoll set is itself a pollable
// descriptor, registered with the runtime (os.NewFile), so a loop with
// nothing to do is a parked goroutine that holds no thread and no P. A
// blocking epoll_wait would hold its P until sysmon took it back (up to
// 10 ms when the process is quiet), and with a loop per P every other
// goroutine (the requests fasthttp serves) would wait that long.
// epoll_wait itself is called with a zero timeout, as a raw syscall.
//
// The events are handled inside the RawConn callback (poll), which parks
// only once a wait returned fewer events than it could take: an event
// that arrives meanwhile makes the runtime's poller mark the set ready
// again (every event added to the set wakes what polls the set), so the
// park returns at once and the callback waits again. A wake costs one
// epoll_wait, not a second one that finds nothing before parking.
func (l *loop) run() {
	wait := l.poll
	for {
		if l.needsArm() {
			if l.active == 0 {
				l.nextScan = time.Time{}
			}
			_ = l.file.SetReadDeadline(l.nextScan)
			l.armed = l.nextScan
		}
		if err := l.rc.Read(wait); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			time.Sleep(10 * time.Millisecond) // cannot happen with a valid set; never spin
			continue
		}
		if l.scanDue() {
			l.scan()
		}
	}
}

// poll is run's RawConn callback: it takes the ready events and handles
// them until a wait returns fewer than it could take, then parks (false),
// unless the scan's deadline must be armed again or the scan is due.
func (l *loop) poll(fd uintptr) bool {
	for {
		r, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, fd, uintptr(unsafe.Pointer(&l.evs[0])), loopEvents, 0, 0, 0)
		n := int(r)
		if errno != 0 {
			n = 0
		}
		for i := range l.evs[:n] {
			slot := uint32(l.evs[i].Fd)
			if slot == wakeSlot {
				l.takeInbox()
				continue
			}
			l.dispatch(slot, uint32(l.evs[i].Pad), l.evs[i].Events)
		}
		if l.ended {
			// Streams ended in this batch: their finish workers run
			// now, on this P, not once the loop parks or another P
			// steals them. The client's next request on each waits for
			// its finish to start fasthttp's ServeConn (BENCHMARKS.md
			// "Session 9": 130-220 µs p50, 800 µs p90 without this).
			l.ended = false
			runtime.Gosched()
		}
		if l.scanDue() || l.needsArm() {
			return true
		}
		if n < loopEvents {
			return false
		}
	}
}

// needsArm reports that file's read deadline is not the scan's: streams
// came or a scan moved nextScan, or the last stream left.
func (l *loop) needsArm() bool {
	if l.active > 0 {
		return !l.armed.Equal(l.nextScan)
	}
	return !l.armed.IsZero()
}

// scanDue reports that the deadline scan's time has come.
func (l *loop) scanDue() bool { return l.active > 0 && !time.Now().Before(l.nextScan) }

// takeInbox starts the streams handed over, and carries out aborts.
func (l *loop) takeInbox() {
	var b [8]byte
	_, _ = syscall.Read(l.evfd, b[:])
	l.mu.Lock()
	in, aborts := l.inbox, l.aborts
	l.inbox, l.aborts = nil, nil
	l.mu.Unlock()
	for _, s := range in {
		l.start(s)
	}
	for _, p := range aborts {
		for _, s := range l.streams {
			if s != nil && s.r.p == p {
				s.failUpstream(errAborted)
			}
		}
	}
}

var errAborted = errors.New("proxy aborted")

// dispatch handles one epoll event of stream slot, registration gen.
func (l *loop) dispatch(slot, pad, ev uint32) {
	if int(slot) >= len(l.streams) {
		return
	}
	s := l.streams[slot]
	if s == nil || s.gen != pad>>1 {
		return // a stale event of a stream that ended
	}
	if pad&1 == sideClientBit {
		s.clientEvent(ev)
	} else {
		s.upstreamReadable(ev&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0)
	}
}

const (
	sideUpstreamBit = 0
	sideClientBit   = 1
)

// loopStarted counts the streams the loops have taken; loopReads their
// upstream reads, added at each stream's end (TestLoopReadsPerEvent).
var loopStarted, loopReads atomic.Int64

// start registers s's sockets and relays what is already there.
func (l *loop) start(s *loopStream) {
	loopStarted.Add(1)
	var slot uint32
	if n := len(l.free); n > 0 {
		slot = l.free[n-1]
		l.free = l.free[:n-1]
	} else {
		slot = uint32(len(l.streams))
		l.streams = append(l.streams, nil)
	}
	l.streams[slot] = s
	l.gen = (l.gen + 1) & (1<<31 - 1)
	s.l, s.slot, s.gen = l, slot, l.gen
	l.active++
	cfg := &s.r.p.cfg
	tick := renewSlack(min(cfg.UpstreamReadTimeout, cfg.ClientWriteTimeout))
	if l.active == 1 || tick < l.tick {
		l.tick = tick
		l.nextScan = time.Now().Add(tick)
	}
	now := time.Now()
	s.lastRead, s.writeMark = now, now
	// The body's first bytes the head's read took went out with the head
	// (toLoop, early); what they said of the body's end is carried out
	// here, where the stream can end, before its sockets are registered.
	if s.earlyErr != nil || s.earlyEnded {
		_ = s.r.resp.CloseBodyStream()
		s.c.giveReader()
		if s.earlyErr != nil {
			s.failUpstream(s.earlyErr)
		} else {
			s.endBody(s.earlyAt)
		}
		return
	}
	if !s.register(s.crc, syscall.EPOLLIN|syscall.EPOLLOUT|syscall.EPOLLRDHUP, sideClientBit) ||
		!s.register(s.urc, syscall.EPOLLIN|syscall.EPOLLRDHUP, sideUpstreamBit) {
		s.failUpstream(errors.New("epoll_ctl failed"))
		return
	}
	s.registered = true
	// What the head's read took from the socket beyond the head (with
	// --inject-usage, which early leaves to the loop) is the body's first
	// bytes: relayed before the socket is read.
	// The loop reads the raw socket from now on: the connection's reader
	// and fasthttp's body stream over it are done with, and the reader goes
	// back to its pool, so a held stream keeps no 16 KiB of its own.
	b := s.c.buffered()
	var raw []byte
	if b > 0 {
		raw = l.buf[loopRoom : loopRoom+b]
		_, _ = io.ReadFull(s.c.br, raw)
	}
	_ = s.r.resp.CloseBodyStream()
	s.c.giveReader()
	if b > 0 {
		s.lastRead = time.Now()
		s.relayRead(raw, s.lastRead)
	}
	s.upstreamReadable(true)
}

// scan ends the streams whose client or upstream has been idle past its
// timeout: the same bounds as the goroutine relay's idle deadlines.
func (l *loop) scan() {
	now := time.Now()
	l.nextScan = now.Add(l.tick)
	for _, s := range l.streams {
		if s == nil {
			continue
		}
		cfg := &s.r.p.cfg
		if s.parked() {
			// A safety net, not the path: once a tick a parked stream
			// tries its write again. A client that shrank its receive
			// buffer mid-connection opened its window by less than the
			// socket's wake-up threshold for seconds, and no EPOLLOUT
			// edge came (seen in TestLoopBackPressure with SetReadBuffer
			// on the client; the goroutine relay went on there).
			s.flush()
			if s.over {
				continue
			}
		}
		switch {
		case s.parked() && now.Sub(s.writeMark) >= cfg.ClientWriteTimeout:
			s.failClient()
		case !s.parked() && !s.upDone && now.Sub(s.lastRead) >= cfg.UpstreamReadTimeout:
			s.failUpstream(errLoopTimeout)
		}
	}
}

// errLoopTimeout is an upstream idle past UpstreamReadTimeout.
var errLoopTimeout = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}

// remove takes s out of the loop: its sockets leave the epoll set and its
// slot is free for the next stream.
func (l *loop) remove(s *loopStream) {
	if s.registered {
		s.unregister(s.crc)
		s.unregister(s.urc)
		s.registered = false
	}
	l.streams[s.slot] = nil
	l.free = append(l.free, s.slot)
	l.active--
}

// loopStream is one stream in a loop: the relay, its two sockets and the
// state of relaying between them. Built by the request's goroutine, owned
// by the loop from add until done; then the goroutine that finishes the
// request only reads it, and the loop touches it no more. One per stream,
// not pooled: after done both sides may still look at it.
type loopStream struct {
	// What each event touches comes first (see relay): the relay, the
	// sockets, the body's framing, the park, the read and write calls.
	l        *loop
	r        *relay
	urc, crc syscall.RawConn

	mode    bodyMode
	left    int64 // bodyLength: bytes still to come
	dec     chunkDecoder
	chunked bool // the client gets the body chunked (HTTP/1.1); else close-delimited

	park     []byte  // bytes the client socket did not take yet
	parkp    *[]byte // park's pooled home
	upDone   bool    // the upstream body ended (or failed)
	dirty    bool    // bytes beyond the response were read: the connection is not pooled
	ending   bool    // the last bytes are parked: the stream ends when they are out
	sentLast bool    // the last chunk went out (or is parked) with the data
	over     bool    // done ran

	lastRead  time.Time
	writeMark time.Time // the last client write progress, or when parking began
	reads     int       // upstream reads, EAGAIN included (loopReads)

	// The RawConn callbacks' argument and results; the callbacks are
	// method values made once per loopStream, so an event allocates none.
	io              []byte
	ioN             int
	ioErr           error
	readFn, writeFn func(uintptr)

	c          *upConn
	cc         *countedConn // the client connection as the listener gave it, detached while the loop holds it
	slot       uint32
	gen        uint32
	srv        *fasthttp.Server
	head       []byte // the response head, written by early, on the handler's goroutine
	prefix     []byte // bytes fasthttp had read from the client beyond the request
	keepAlive  bool   // the client connection goes back to fasthttp at the end
	registered bool

	// What early found in the body's first bytes, for start: the body
	// ended in them (at earlyAt), or is broken (earlyErr). headErr: the
	// head's write failed, for hijacked.
	earlyEnded bool
	earlyAt    time.Time
	earlyDone  time.Time // the early write that ended the body returned
	earlyErr   error
	headErr    error

	peek   int
	peekFn func(uintptr)
	ctlOp  int
	ctlEv  syscall.EpollEvent
	ctlErr error
	ctlFn  func(uintptr)
}

type bodyMode uint8

const (
	bodyChunked bodyMode = iota
	bodyLength
	bodyClose
)

func newLoopStream() *loopStream {
	s := &loopStream{}
	s.readFn, s.writeFn, s.peekFn, s.ctlFn = s.doRead, s.doWrite, s.doPeek, s.doCtl
	return s
}

// doRead and doWrite are raw system calls: the sockets are non-blocking,
// so a call never blocks, and syscall.Read's entry into the runtime's
// syscall state would wake sysmon from its sleep on every call in a quiet
// process (entersyscallWakeSysmon: a futex wake, 8% of the loop's CPU in
// the profile of 16 streams). Neither waits in the runtime's poller.
//
// They run under the RawConn's Control, not its Read and Write: the
// descriptor is held against a Close all the same (Control fails once a
// Close began), but without the read or write lock and the poller's
// deadline check, which a call that never waits does not need; the loop
// keeps its own idle timeouts (scan), and the sockets carry no deadline
// while it holds them (toLoop, hijacked).
func (s *loopStream) doRead(fd uintptr) {
	s.ioN, s.ioErr = rawIO(syscall.SYS_READ, fd, s.io)
}

func (s *loopStream) doWrite(fd uintptr) {
	s.ioN, s.ioErr = rawIO(syscall.SYS_WRITE, fd, s.io)
}

// rawIO is read(2) or write(2) of b on fd as syscall.Read and Write
// report it (n is -1 with an error), without entering the runtime's
// syscall state: for non-blocking descriptors only. b is never empty.
func rawIO(trap, fd uintptr, b []byte) (int, error) {
	r, _, errno := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

func (s *loopStream) doPeek(fd uintptr) {
	var b [1]byte
	s.peek, _ = peekFD(int(fd), b[:])
}

func (s *loopStream) doCtl(fd uintptr) {
	s.ctlErr = syscall.EpollCtl(s.l.epfd, s.ctlOp, int(fd), &s.ctlEv)
}

// register adds one socket to the loop's epoll set; under the RawConn's
// Control, so the descriptor cannot be closed and reused meanwhile.
func (s *loopStream) register(rc syscall.RawConn, events uint32, side uint32) bool {
	s.ctlOp = syscall.EPOLL_CTL_ADD
	s.ctlEv = syscall.EpollEvent{Events: events | epollET, Fd: int32(s.slot), Pad: int32(s.gen<<1 | side)}
	if rc.Control(s.ctlFn) != nil {
		return false
	}
	return s.ctlErr == nil
}

func (s *loopStream) unregister(rc syscall.RawConn) {
	s.ctlOp = syscall.EPOLL_CTL_DEL
	_ = rc.Control(s.ctlFn) // a closed socket has left the set already
}

// readUp reads the upstream socket into b.
func (s *loopStream) readUp(b []byte) (int, error) {
	s.io = b
	if err := s.urc.Control(s.readFn); err != nil {
		return 0, err
	}
	s.io = nil
	return s.ioN, s.ioErr
}

// writeClient writes b to the client socket until it is all out or the
// socket is full (EAGAIN); n is never negative. A short write is retried,
// as nginx does: the kernel promises an EPOLLOUT edge after EAGAIN
// (sk_stream_wait_memory sets SOCK_NOSPACE then), which is what a parked
// stream waits for.
func (s *loopStream) writeClient(b []byte) (int, error) {
	total := 0
	for total < len(b) {
		s.io = b[total:]
		if err := s.crc.Control(s.writeFn); err != nil {
			s.io = nil
			return total, err
		}
		s.io = nil
		if s.ioErr != nil {
			if s.ioErr == syscall.EINTR {
				continue
			}
			return total, s.ioErr
		}
		total += max(s.ioN, 0)
	}
	return total, nil
}

func (s *loopStream) parked() bool { return len(s.park) > 0 }

// upstreamReadable reads the upstream socket until it is drained, relaying
// each read, unless the client socket is full. A read shorter than the
// buffer drained the socket, as nginx takes it (ngx_unix_recv): on an
// edge-triggered set the next bytes bring a new event, so the read that
// would only return EAGAIN is saved, one system call per event. Not when
// drain is set: the peer's close was seen (EPOLLRDHUP), and the EOF that
// follows the bytes brings no new event; or the caller knows of no event
// (the stream's start, the end of a park).
func (s *loopStream) upstreamReadable(drain bool) {
	l := s.l
	for !s.over && !s.upDone && !s.parked() {
		raw := l.buf[loopRoom : loopRoom+relayBufSize]
		n, err := s.readUp(raw)
		s.reads++
		if n > 0 {
			s.lastRead = time.Now()
			s.relayRead(raw[:n], s.lastRead)
			if n < len(raw) && !drain {
				return
			}
			continue
		}
		switch {
		case errors.Is(err, syscall.EAGAIN):
			return
		case errors.Is(err, syscall.EINTR):
			continue
		case err == nil: // EOF
			if s.mode == bodyClose {
				s.endBody(time.Now())
				return
			}
			s.failUpstream(io.ErrUnexpectedEOF)
		default:
			s.failUpstream(err)
		}
		return
	}
}

// relayRead forwards one read of the upstream body, raw as it came off
// the socket (at l.buf[loopRoom:]), that arrived at t; then measures it.
func (s *loopStream) relayRead(raw []byte, t time.Time) {
	r := s.r
	data, ended, err := s.decode(raw)
	out := data
	if r.inject {
		out = r.filter(data, t)
	}
	if len(out) > 0 || (ended && s.chunked && len(r.hold) == 0) {
		s.send(s.frameData(out, data, ended), t)
		if s.over {
			return
		}
	}
	r.p.rec.ObserveRelay(time.Since(t))
	if !r.inject {
		r.measure(data, t)
	}
	if err != nil {
		s.failUpstream(err)
		return
	}
	if ended {
		s.endBody(time.Now())
	}
}

// decode takes the body's bytes out of one read: de-chunked in place, or
// counted against the Content-Length. ended says the body is complete.
func (s *loopStream) decode(raw []byte) (data []byte, ended bool, err error) {
	switch s.mode {
	case bodyChunked:
		n, used, derr := s.dec.decode(raw)
		if used < len(raw) {
			s.dirty = true // bytes beyond the response
		}
		if derr != nil {
			return raw[:n], false, derr
		}
		return raw[:n], s.dec.done(), nil
	case bodyLength:
		n := int64(len(raw))
		if n > s.left {
			s.dirty = true
			n = s.left
		}
		s.left -= n
		return raw[:n], s.left == 0, nil
	}
	return raw, false, nil
}

// frameData returns out as the client gets it: one chunk (HTTP/1.1) or
// the bytes as they are (HTTP/1.0, close-delimited); last adds the last
// chunk when nothing is held back (--inject-usage's tail goes first).
// When out is data, in the loop's buffer, the chunk is built around it in
// place.
func (s *loopStream) frameData(out, data []byte, last bool) []byte {
	if !s.chunked {
		return out
	}
	last = last && len(s.r.hold) == 0
	s.sentLast = s.sentLast || last
	l := s.l
	if len(out) > 0 && len(data) > 0 && &out[0] == &data[0] {
		var size [loopRoom]byte
		line := appendChunkSize(size[:0], len(out))
		start := loopRoom - len(line)
		copy(l.buf[start:], line)
		end := loopRoom + len(out)
		l.buf[end], l.buf[end+1] = '\r', '\n'
		end += 2
		if last {
			end += copy(l.buf[end:], lastChunk)
		}
		return l.buf[start:end]
	}
	l.frame = appendFrame(l.frame[:0], out, last)
	return l.frame
}

// appendFrame appends out as one chunk, and the last chunk if last, to b.
func appendFrame(b, out []byte, last bool) []byte {
	if len(out) > 0 {
		b = append(appendChunkSize(b, len(out)), out...)
		b = append(b, '\r', '\n')
	}
	if last {
		b = append(b, lastChunk...)
	}
	return b
}

// send writes b to the client; what the socket does not take is parked
// until it is writable, and the upstream is not read meanwhile.
func (s *loopStream) send(b []byte, now time.Time) {
	if s.parked() { // in order behind what waits
		s.park = append(s.park, b...)
		return
	}
	n, err := s.writeClient(b)
	if err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR) {
		s.failClient()
		return
	}
	if n < len(b) {
		if s.park == nil {
			s.parkp = parkBufs.Get().(*[]byte)
			s.park = (*s.parkp)[:0]
		}
		s.park = append(s.park, b[n:]...)
		s.writeMark = now
		if m := int64(len(s.park)); m > loopParkMax.Load() {
			loopParkMax.Store(m) // racy max, for tests: once per park, not per event
		}
	}
}

// loopParkMax is the most bytes one stream has parked, for tests.
var loopParkMax atomic.Int64

// parkBufs holds the buffers of parked bytes: a stream takes one only
// while its client is slower than its engine.
var parkBufs = sync.Pool{New: func() any { b := make([]byte, 0, relayBufSize); return &b }}

// clientEvent handles the client socket: writable again, or gone.
func (s *loopStream) clientEvent(ev uint32) {
	if ev&(syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
		s.failClient()
		return
	}
	if ev&(syscall.EPOLLIN|syscall.EPOLLRDHUP) != 0 {
		_ = s.crc.Control(s.peekFn)
		if s.peek == peekClosed {
			s.failClient()
			return
		}
		// Bytes: a pipelined request, for fasthttp after the stream.
	}
	if ev&syscall.EPOLLOUT != 0 && s.parked() {
		s.flush()
	}
}

// flush writes parked bytes; once they are out the stream goes on (or
// ends).
func (s *loopStream) flush() {
	n, err := s.writeClient(s.park)
	if err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR) {
		s.failClient()
		return
	}
	if n > 0 {
		s.writeMark = time.Now()
	}
	s.park = s.park[:copy(s.park, s.park[n:])]
	if len(s.park) > 0 {
		return
	}
	s.dropPark()
	if s.ending {
		s.done(true)
		return
	}
	s.upstreamReadable(true)
}

func (s *loopStream) dropPark() {
	if s.parkp != nil && cap(s.park) <= 4*relayBufSize {
		*s.parkp = s.park[:0]
		parkBufs.Put(s.parkp)
	}
	s.park, s.parkp = nil, nil
}

// endBody ends a complete upstream body: the held tail of --inject-usage
// and the last chunk go out, and the stream ends once they have.
func (s *loopStream) endBody(t time.Time) {
	r := s.r
	s.upDone = true
	r.atEOF = true
	r.endAt(t)
	if len(r.hold) > 0 { // an incomplete last event: forwarded as it came
		hold := r.hold
		r.tr.RespBytes += int64(len(hold))
		r.hold = r.hold[:0]
		s.send(s.frameData(hold, nil, true), t)
		if s.over {
			return
		}
	}
	if s.chunked && !s.sentLast {
		s.sentLast = true
		s.send(lastChunk, t)
		if s.over {
			return
		}
	}
	if s.parked() {
		s.ending = true
		return
	}
	s.done(true)
}

// failUpstream ends the stream on an upstream read error: the client's
// response is cut without its last chunk, so a broken generation never
// looks complete.
func (s *loopStream) failUpstream(err error) {
	if s.over {
		return
	}
	r := s.r
	switch {
	case r.hasLeft():
		r.fail(SideClient, ErrClientGone)
	case errors.Is(err, errBadChunk):
		r.fail(SideUpstream, ErrUpstreamBroken)
	default:
		r.fail(SideUpstream, streamFailure(err))
	}
	s.upDone = true
	s.done(false)
}

// failClient ends the stream for a client that went away: the upstream
// connection is closed at once, so the engine stops generating.
func (s *loopStream) failClient() {
	if s.over {
		return
	}
	s.r.fail(SideClient, ErrClientGone)
	_ = s.c.Close()
	s.done(false)
}

// done takes the stream out of the loop and finishes the request on a
// worker (worker.go): the Trace, the connections back to their pools,
// and the client connection to fasthttp for its next request (ok and
// keep-alive) or closed.
func (s *loopStream) done(ok bool) {
	s.over = true
	loopReads.Add(int64(s.reads))
	s.l.remove(s)
	s.dropPark()
	s.r.tr.ClientDone = time.Now()
	if !s.earlyDone.IsZero() {
		s.r.tr.ClientDone = s.earlyDone // the whole body left with the head
	}
	s.l.ended = true
	keep := ok && s.keepAlive
	workers.run(func() { s.finish(keep) })
}

// finish runs on a worker once the loop let go of the stream.
func (s *loopStream) finish(keep bool) {
	r, p, c, cc := s.r, s.r.p, s.c, s.cc
	c.readDL.clear() // the next request on c sets its own read deadline
	if s.dirty {
		r.up.Store(nil)
		p.pool.discard(c)
	}
	_ = r.resp.CloseBodyStream()
	var conn net.Conn = cc
	if len(s.prefix) > 0 {
		conn = &prefixConn{Conn: cc, prefix: s.prefix}
	}
	srv := s.srv
	p.conclude(r)
	if keep && !p.draining.Load() && cc.awaitRelease(time.Second) {
		// The Trace is reported beside the client's next request, not
		// before it is read: a client sends it the moment the last chunk
		// arrives, and the report (Record, the log line: about 10 µs of
		// CPU, 100 µs on a busy 2-core host) stood before its first byte
		// (BENCHMARKS.md "Session 15"). The goroutine relay reports
		// before the last chunk leaves instead (CloseWithError).
		workers.run(func() { p.report(r) })
		_ = srv.ServeConn(conn)
		return
	}
	p.report(r)
	_ = conn.Close()
}

// prefixConn is a client connection with bytes fasthttp had already read
// from it (a pipelined request) in front: it reads them first. It hides
// the socket (no SyscallConn), so later requests on it stay on the
// goroutine relay and are not watched: the watch and the loop look at the
// socket, which would not show the bytes held here. To the pool it is a
// new client connection (idle upstream connections are bound to the
// client connection object): the one its first request left idle is not
// reused, and goes at the idle timeout. Rare: only a client that pipelines
// behind a stream gets one.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// rawConnOf returns the RawConn of a socket, or nil.
func rawConnOf(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// toLoop hands a streamed response to a loop, if it can go there: the
// event loop is on, the server can take the connection back, both sockets
// are plain TCP, the client connection came through Proxy.Listener (so
// that it can outlive the hijack: countedConn.detach), and the client
// asked for no trailers. It reports whether it did; then fasthttp writes
// nothing, and the loop owns the stream.
func (p *Proxy) toLoop(ctx *fasthttp.RequestCtx, r *relay) bool {
	if !p.cfg.EventLoop || r.clientHeader != nil {
		return false
	}
	srv := p.srv.Load()
	c := r.up.Load()
	if srv == nil || c == nil || c.raw != c.Conn { // TLS upstream: the loop reads raw sockets
		return false
	}
	cc, ok := ctx.Conn().(*countedConn)
	if !ok {
		return false
	}
	urc, crc := rawConnOf(c.raw), rawConnOf(cc.Conn)
	if urc == nil || crc == nil || nextLoop() == nil {
		return false
	}
	// The loop keeps its own idle bounds (its RawConn calls pass no
	// deadline check): none is left to fire while it holds the socket.
	_ = c.Conn.SetDeadline(time.Time{})
	c.readDL.clear()
	c.writeDL.clear()
	s := newLoopStream()
	s.r, s.c, s.cc, s.srv, s.urc, s.crc = r, c, cc, srv, urc, crc
	switch cl := r.resp.Header.ContentLength(); {
	case cl == -1:
		s.mode = bodyChunked
	case cl >= 0:
		s.mode, s.left = bodyLength, int64(cl)
	default:
		s.mode = bodyClose
	}
	http11 := ctx.Request.Header.IsHTTP11()
	s.chunked = http11
	s.keepAlive = http11 && !ctx.Request.Header.ConnectionClose() && !ctx.Response.Header.ConnectionClose()
	s.head = appendHead(make([]byte, 0, 512), &ctx.Response.Header, true)
	if !s.keepAlive {
		s.head = append(s.head, "Connection: close\r\n"...)
	}
	if http11 {
		s.head = append(s.head, "Transfer-Encoding: chunked\r\n"...)
	}
	s.head = append(s.head, "\r\n"...)
	r.endWatch() // the loop watches the client from now on
	r.giveBuf()  // the loop reads into its own buffer: a held stream keeps no 16 KiB of its own
	s.early(cc)
	cc.detach() // fasthttp's close after the hijack handler is ignored
	cc.hold()   // and ServeConn waits until fasthttp let go of cc
	p.hijack(ctx, s.hijacked, s.abandoned)
	return true
}

// early writes the head, and with it the body's first bytes that the
// head's read took from the engine's socket (the first event, as engines
// send it with the head), in one write, on the handler's goroutine: the
// first byte does not wait for the goroutine fasthttp starts for the
// hijack to be scheduled, nor the first event for the loop to wake and
// take the stream (issue 25, BENCHMARKS.md "Session 9"). In order: every
// earlier response on the connection has left fasthttp's writer, as for
// forwardInterim (flushEachResponse). Forward first, measure second: the
// bytes are measured once written. With --inject-usage the body's bytes
// are left to the loop, which filters them. A write that fails is
// hijacked's to end (headErr).
func (s *loopStream) early(cc net.Conn) {
	r, c := s.r, s.c
	var buf *[relayBufSize]byte
	var data []byte
	var t time.Time
	b := c.buffered()
	if s.mode == bodyLength && s.left == 0 {
		// Content-Length: 0 (an engine's empty stream): the body ended
		// with the head, as the goroutine relay's first read finds; the
		// loop must not wait for bytes of it. Bytes the head's read took
		// beyond it keep the connection out of the pool.
		s.dirty = b > 0
		b = 0
		s.earlyEnded, s.earlyAt = true, time.Now()
		if s.chunked {
			s.sentLast = true
			s.head = append(s.head, lastChunk...)
		}
	}
	if b > 0 && !r.inject {
		buf = relayBufs.Get().(*[relayBufSize]byte) // b <= upstreamBufSize == relayBufSize
		raw := buf[:b]
		_, _ = io.ReadFull(c.br, raw)
		t = time.Now()
		var ended bool
		data, ended, s.earlyErr = s.decode(raw)
		if ended && s.earlyErr == nil {
			s.earlyEnded, s.earlyAt = true, t
		}
		if s.chunked {
			last := s.earlyEnded
			s.sentLast = last
			s.head = appendFrame(s.head, data, last)
		} else {
			s.head = append(s.head, data...)
		}
	}
	_ = cc.SetWriteDeadline(time.Now().Add(r.p.cfg.ClientWriteTimeout))
	r.headOut = true
	_, s.headErr = cc.Write(s.head)
	if s.earlyEnded && s.headErr == nil {
		s.earlyDone = time.Now() // the client's last byte: done stamps it, later, on the loop
	}
	_ = cc.SetWriteDeadline(time.Time{})
	s.head = nil // not kept while the stream is held
	if buf == nil {
		return
	}
	if s.headErr == nil {
		r.p.rec.ObserveRelay(time.Since(t))
		r.measure(data, t)
	}
	relayBufs.Put(buf)
}

// abandoned ends a stream whose hijack fasthttp dropped (it closed the
// client connection without running hijacked): the client got the head
// and the first bytes early wrote at most, without the body's end, and the
// engine's connection is closed.
func (s *loopStream) abandoned() {
	_ = s.cc.Close() // fasthttp's close was the one detach ignored
	s.r.fail(SideClient, ErrClientGone)
	_ = s.c.Close()
	s.r.tr.ClientDone = time.Now()
	s.r.p.finish(s.r)
}

// hijacked runs on the goroutine fasthttp starts for the hijacked
// connection: it takes what fasthttp had read from the client beyond the
// request and hands the stream to a loop (the head is out already:
// early).
func (s *loopStream) hijacked(hjc net.Conn) {
	if s.headErr != nil { // early's write
		s.r.fail(SideClient, ErrClientGone)
		_ = s.c.Close()
		s.r.tr.ClientDone = time.Now()
		s.finish(false)
		return
	}
	s.prefix = takeBuffered(hjc) // which leaves no read deadline, as early's write left none
	nextLoop().add(s)
}

// takeBuffered returns the bytes fasthttp's reader holds for the hijacked
// connection c, without reading the socket: with a read deadline in the
// past, a read returns only what is buffered.
func takeBuffered(c net.Conn) []byte {
	if c.SetReadDeadline(time.Unix(1, 0)) != nil {
		return nil
	}
	var out []byte
	var b [512]byte
	for {
		n, err := c.Read(b[:])
		out = append(out, b[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	return out
}
