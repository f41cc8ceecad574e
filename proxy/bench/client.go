package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// clientConn is one client's keep-alive HTTP/1.1 connection to a target.
// The bench speaks HTTP itself, over its own read buffer, so that it knows
// which read(2) delivered the last byte of each event: that read's return
// is the event's arrival time, with no library buffering in between. It
// understands what the targets send: a status line, headers, and a body
// framed by chunks, by Content-Length, or by the close.
//
// A clientConn is used by one goroutine at a time.
type clientConn struct {
	c      net.Conn
	head   []byte // request bytes, reused
	buf    []byte
	r, w   int   // unread bytes are buf[r:w]
	stamp  int64 // now() when the last read returned
	broken bool  // the response was not read to its end: the conn is unusable
}

const clientBufSize = 16 << 10

var (
	errResponse = errors.New("bench: malformed response")
	errStatus   = errors.New("bench: response status is not 200")
)

// dialClient connects to addr with a read buffer of bufSize bytes.
func dialClient(addr string, bufSize int) (*clientConn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return &clientConn{c: c, buf: make([]byte, bufSize)}, nil
}

func (cc *clientConn) Close() error { return cc.c.Close() }

// send writes one POST of body, head and body in one write(2), and
// returns when it was written from.
func (cc *clientConn) send(host string, body []byte, stream bool) (int64, error) {
	h := append(cc.head[:0], "POST /v1/chat/completions HTTP/1.1\r\nHost: "...)
	h = append(h, host...)
	h = append(h, "\r\nContent-Type: application/json\r\nUser-Agent: anvilproxy-bench\r\n"...)
	if stream {
		h = append(h, "Accept: text/event-stream\r\n"...)
	}
	h = append(h, "Content-Length: "...)
	h = strconv.AppendInt(h, int64(len(body)), 10)
	h = append(h, "\r\n\r\n"...)
	h = append(h, body...)
	cc.head = h
	t := now()
	if _, err := cc.c.Write(h); err != nil {
		cc.broken = true
		return t, fmt.Errorf("writing request: %w", err)
	}
	return t, nil
}

// fill reads once more into the buffer, compacting it first when the
// unread bytes sit at its end.
func (cc *clientConn) fill() error {
	if cc.r > 0 && (cc.r == cc.w || cc.w == len(cc.buf)) {
		cc.w = copy(cc.buf, cc.buf[cc.r:cc.w])
		cc.r = 0
	}
	if cc.w == len(cc.buf) {
		return fmt.Errorf("%w: line longer than %d bytes", errResponse, len(cc.buf))
	}
	n, err := cc.c.Read(cc.buf[cc.w:])
	cc.stamp = now()
	cc.w += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// line returns the next CRLF-terminated line without its terminator.
func (cc *clientConn) line() ([]byte, error) {
	for {
		if i := bytes.Index(cc.buf[cc.r:cc.w], []byte("\r\n")); i >= 0 {
			l := cc.buf[cc.r : cc.r+i]
			cc.r += i + 2
			return l, nil
		}
		if err := cc.fill(); err != nil {
			return nil, err
		}
	}
}

// framing is how a response body ends.
type framing struct {
	chunked bool
	length  int64 // with !chunked: -1 means until the close
}

// readHead reads the status line and headers. first is the arrival of the
// response's first byte.
func (cc *clientConn) readHead() (fr framing, first int64, err error) {
	if cc.r == cc.w {
		if err := cc.fill(); err != nil {
			return fr, 0, err
		}
	}
	first = cc.stamp
	status, err := cc.line()
	if err != nil {
		return fr, first, err
	}
	if !bytes.HasPrefix(status, []byte("HTTP/1.1 ")) && !bytes.HasPrefix(status, []byte("HTTP/1.0 ")) {
		return fr, first, fmt.Errorf("%w: status line %q", errResponse, status)
	}
	// The status line's bytes are gone once the buffer refills: judge it now.
	ok := bytes.HasPrefix(status[len("HTTP/1.1 "):], []byte("200 ")) || len(status) == len("HTTP/1.1 200")
	var statusErr error
	if !ok {
		statusErr = fmt.Errorf("%w: %q", errStatus, status)
	}
	fr.length = -1
	for {
		l, err := cc.line()
		if err != nil {
			return fr, first, err
		}
		if len(l) == 0 {
			break
		}
		name, value, ok := bytes.Cut(l, []byte(":"))
		if !ok {
			return fr, first, fmt.Errorf("%w: header %q", errResponse, l)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			fr.chunked = bytes.Contains(bytes.ToLower(value), []byte("chunked"))
		case bytes.EqualFold(name, []byte("Content-Length")):
			if fr.length, err = strconv.ParseInt(string(value), 10, 64); err != nil {
				return fr, first, fmt.Errorf("%w: Content-Length %q", errResponse, value)
			}
		}
	}
	return fr, first, statusErr
}

// readBody hands the body to sink piece by piece, with the arrival time of
// the read that delivered each piece, and returns at its end.
func (cc *clientConn) readBody(fr framing, sink func(b []byte, at int64)) error {
	if !fr.chunked {
		return cc.readN(fr.length, sink)
	}
	for {
		l, err := cc.line()
		if err != nil {
			return err
		}
		if i := bytes.IndexByte(l, ';'); i >= 0 {
			l = l[:i]
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(l)), 16, 64)
		if err != nil || size < 0 {
			return fmt.Errorf("%w: chunk size %q", errResponse, l)
		}
		if size == 0 {
			for { // trailers, up to the blank line
				l, err := cc.line()
				if err != nil {
					return err
				}
				if len(l) == 0 {
					return nil
				}
			}
		}
		if err := cc.readN(size, sink); err != nil {
			return err
		}
		if l, err := cc.line(); err != nil || len(l) != 0 {
			return fmt.Errorf("%w: chunk not followed by CRLF", errResponse)
		}
	}
}

// readN hands n bytes to sink; n < 0 means until the close.
func (cc *clientConn) readN(n int64, sink func(b []byte, at int64)) error {
	for n != 0 {
		if cc.r == cc.w {
			if err := cc.fill(); err != nil {
				if n < 0 && errors.Is(err, io.EOF) {
					cc.broken = true // the server closed it
					return nil
				}
				return err
			}
		}
		k := int64(cc.w - cc.r)
		if n > 0 {
			k = min(k, n)
			n -= k
		}
		sink(cc.buf[cc.r:cc.r+int(k)], cc.stamp)
		cc.r += int(k)
	}
	return nil
}
