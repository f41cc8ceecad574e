package proxy

import (
	"crypto/x509"
	"time"
)

// Defaults for the zero values of Config.
const (
	DefaultMaxBodyBytes        = 64 << 20
	DefaultMaxHeaderBytes      = 64 << 10
	DefaultReadTimeout         = 60 * time.Second
	DefaultClientWriteTimeout  = 2 * time.Minute
	DefaultUpstreamReadTimeout = 10 * time.Minute
	DefaultDialTimeout         = 5 * time.Second
	DefaultMaxUpstreamConns    = 4096
	DefaultUpstreamIdleTimeout = 4 * time.Second
	DefaultMaxInflightBody     = 1 << 30
	DefaultMaxConnWait         = 100 * time.Millisecond
	DefaultMaxModels           = 16
	DefaultMaxCaptureBytes     = 4 << 20
	DefaultMaxQueue            = 1024
	DefaultMaxQueueWait        = 10 * time.Minute
)

// Config configures a Proxy. The zero value of every field but Upstream
// selects the default named in its comment. Config is read once by New.
type Config struct {
	// Upstream is the inference server's base URL, http or https, with an
	// optional path prefix that is joined in front of every request path.
	Upstream string

	// MaxBodyBytes limits a request body; larger ones get 413. 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int
	// MaxHeaderBytes limits the request headers; larger ones get 431. 0 means DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// ReadTimeout bounds reading one whole request from the client (headers
	// and body), which cuts slowloris clients. 0 means DefaultReadTimeout.
	ReadTimeout time.Duration
	// ClientWriteTimeout is an idle timeout per write to the client: a client
	// that accepts no bytes for this long is dropped. It never limits a
	// healthy stream's total length. 0 means DefaultClientWriteTimeout.
	ClientWriteTimeout time.Duration
	// UpstreamReadTimeout is an idle timeout per read from the upstream,
	// including the wait for response headers (queue and prefill), like
	// nginx's proxy_read_timeout. 0 means DefaultUpstreamReadTimeout.
	UpstreamReadTimeout time.Duration
	// DialTimeout bounds connecting to the upstream. 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// MaxUpstreamConns bounds upstream connections; every stream holds one
	// for its whole generation. 0 means DefaultMaxUpstreamConns.
	MaxUpstreamConns int
	// UpstreamIdleTimeout is how long an upstream connection may sit idle
	// in the pool before the proxy closes it. It must be shorter than the
	// engine's own keep-alive timeout (uvicorn, in front of vLLM and
	// SGLang: 5 s), so that the proxy, not the engine, closes first.
	// 0 means DefaultUpstreamIdleTimeout.
	UpstreamIdleTimeout time.Duration
	// MaxClientConns bounds client connections on the data listener; one
	// more is answered 503 and closed. 0 means no bound here (serve derives
	// one from the file-descriptor limit).
	MaxClientConns int
	// MaxInflightBodyBytes bounds the request bodies held in memory at once,
	// all requests together; a request that would exceed it gets 503 with
	// Retry-After. 0 means DefaultMaxInflightBody.
	MaxInflightBodyBytes int64
	// MaxConnWait is how long a request waits for a free upstream connection
	// before 503. 0 means DefaultMaxConnWait.
	MaxConnWait time.Duration
	// NoForwardedFor turns off appending the client address to X-Forwarded-For.
	NoForwardedFor bool
	// PreserveHost sends the client's Host header upstream instead of the upstream's own.
	PreserveHost bool
	// InsecureSkipVerify skips TLS verification of an https upstream.
	InsecureSkipVerify bool
	// UpstreamRootCAs, when set, are the certificate authorities an https
	// upstream's certificate is verified against instead of the system's
	// (a private CA; the tests' own). There is no flag for it.
	UpstreamRootCAs *x509.CertPool
	// Models is the allowlist of model labels; others are labelled "other".
	// Empty means the first MaxModels names seen are learned.
	Models []string
	// MaxModels bounds learned model labels. 0 means DefaultMaxModels.
	MaxModels int
	// MaxEventBytes bounds one SSE event while parsing (the bytes are still
	// forwarded). 0 means the sse package default.
	MaxEventBytes int
	// MaxInflight, when positive, is a local concurrency limit: at most this
	// many requests go upstream at once and the rest wait in FIFO order.
	// Set it to the engine's slot count to measure the queue exactly.
	MaxInflight int
	// MaxQueue bounds the requests waiting for the limiter; one more gets
	// 429. 0 means DefaultMaxQueue.
	MaxQueue int
	// MaxQueueWait bounds one request's wait in the limiter; past it, 503.
	// 0 means DefaultMaxQueueWait.
	MaxQueueWait time.Duration
	// InjectUsage adds stream_options.include_usage=true to streamed chat
	// and completions requests that did not ask for it, so that token
	// counts come from the engine, and removes the extra usage-only event
	// from what the client receives.
	InjectUsage bool
	// RetryWindow is how long after an attempt the same body from the same
	// client counts as a retry. 0 means retry.DefaultWindow (10 min).
	RetryWindow time.Duration
	// RetryMaxBytes caps the retry tracker's memory. 0 means retry.DefaultMaxBytes.
	RetryMaxBytes int64
	// PrefixMaxBytes caps the prefix index's memory. 0 means prefix.DefaultMaxIndexBytes.
	PrefixMaxBytes int64
	// VolatileFields are JSON key paths (e.g. "metadata.timestamp") and
	// VolatilePatterns regular expressions on prompt text that are masked
	// before prefix hashing, to ask "would it hit if this were fixed?".
	VolatileFields   []string
	VolatilePatterns []string
	// EventLoop relays streamed responses on a few event loops instead of
	// the connection's goroutine, on Linux (docs/design.md "The event-loop
	// relay"); elsewhere it changes nothing.
	EventLoop bool
	// MaxCaptureBytes bounds how much of a non-stream JSON response is kept
	// to read its usage; a larger answer is relayed whole and read for
	// none. 0 means DefaultMaxCaptureBytes.
	MaxCaptureBytes int
}

// upstream is the parsed Upstream URL.

func (c *Config) setDefaults() {
	setDefault(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&c.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setDefault(&c.ReadTimeout, DefaultReadTimeout)
	setDefault(&c.ClientWriteTimeout, DefaultClientWriteTimeout)
	setDefault(&c.UpstreamReadTimeout, DefaultUpstreamReadTimeout)
	setDefault(&c.DialTimeout, DefaultDialTimeout)
	setDefault(&c.MaxUpstreamConns, DefaultMaxUpstreamConns)
	setDefault(&c.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout)
	if c.MaxInflightBodyBytes <= 0 {
		c.MaxInflightBodyBytes = DefaultMaxInflightBody
	}
	setDefault(&c.MaxConnWait, DefaultMaxConnWait)
	setDefault(&c.MaxModels, DefaultMaxModels)
	setDefault(&c.MaxCaptureBytes, DefaultMaxCaptureBytes)
	setDefault(&c.MaxQueue, DefaultMaxQueue)
	setDefault(&c.MaxQueueWait, DefaultMaxQueueWait)
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
