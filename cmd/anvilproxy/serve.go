package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/snapshot"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
	"github.com/anvilproxy/anvilproxy/proxy/retry"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// embeddedUpstream is the --upstream value that starts the simulated engine
// in-process, so that "anvilproxy serve" works on a machine with no GPU.
const embeddedUpstream = "sim"

type serveFlags struct {
	config        string
	listen        string
	adminListen   string
	adminToken    string
	upstream      string
	probeEvery    time.Duration
	logLevel      string
	shutdownGrace time.Duration
	models        string
	slos          sloFlag
	baseline      string
	cfg           proxy.Config
	histo         histo.Config
	snapshot      snapshot.Config
	engine        engineFlags
	// sim configures the embedded engine of --upstream sim. It is not a
	// flag: serve runs the calibrated default; demo and tests set it.
	sim sim.Config
}

// listFlag collects a repeated string flag, one value per use (a regular
// expression may contain commas).
type listFlag []string

func (f *listFlag) String() string { return strings.Join(*f, ",") }

func (f *listFlag) Set(v string) error {
	*f = append(*f, v)
	return nil
}

// sloFlag collects repeated --slo metric=duration flags.
type sloFlag []histo.SLO

func (f *sloFlag) String() string {
	parts := make([]string, len(*f))
	for i, s := range *f {
		parts[i] = s.String()
	}
	return strings.Join(parts, ",")
}

func (f *sloFlag) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		s, err := histo.ParseSLO(part)
		if err != nil {
			return err
		}
		*f = append(*f, s)
	}
	return nil
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "file of flag=value lines, one flag per line, # comments (configs/anvilproxy.example.conf lists every flag); flags on the command line override it")
	fs.StringVar(&f.listen, "listen", ":8080", "address the proxy listens on for agents (host:port)")
	fs.StringVar(&f.adminListen, "admin-listen", ":9464", "address of the admin listener: the dashboard at /, /metrics, /snapshot, /requests, /status, /healthz, /readyz (separate from --listen so no upstream path is shadowed); empty disables it")
	fs.StringVar(&f.adminToken, "admin-token", "", "when set, /requests, /snapshot, /status and /diff answer only requests with \"Authorization: Bearer TOKEN\" (open the dashboard as /#token=TOKEN); /metrics, /healthz and /readyz stay open for scrapers and probes")
	fs.DurationVar(&f.snapshot.Interval, "snapshot-interval", snapshot.DefaultInterval, "length of a measurement window (rolling goodput; one snapshot file per window with --snapshot-dir)")
	fs.StringVar(&f.snapshot.Dir, "snapshot-dir", "", "directory for one anvil-serving.benchmark/v1 snapshot file per window, written atomically (one proxy per directory); empty writes none")
	fs.IntVar(&f.snapshot.Keep, "snapshot-keep", snapshot.DefaultKeep, "most snapshot files kept in --snapshot-dir; the oldest are removed first")
	fs.Int64Var(&f.snapshot.MaxBytes, "snapshot-max-bytes", snapshot.DefaultMaxBytes, "most bytes of snapshot files kept in --snapshot-dir; the oldest are removed first (the newest is always kept)")
	fs.StringVar(&f.baseline, "baseline", "", "snapshot file or directory (several joined with commas) the dashboard compares the window in progress against, as anvilproxy diff does (admin /diff)")
	fs.Var(&f.slos, "slo", "latency objective for goodput, metric=duration with metric one of "+strings.Join(histo.SLONames(), ", ")+"; repeatable or comma-separated (e.g. --slo ttft=2s --slo tpot=50ms)")
	fs.IntVar(&f.histo.EngineSlots, "engine-slots", 0, "a hint of the upstream engine's concurrent sequences for the queue/prefill split; 0: learn it from observation (evidence overrides a hint, with a warning)")
	f.engine.register(fs)
	fs.StringVar(&f.upstream, "upstream", embeddedUpstream, `inference server root URL, http(s)://host:port[/prefix], without the /v1 of its OpenAI base URL (the client's /v1/... path is appended); "sim" starts the simulated engine in-process on a loopback port`)
	fs.DurationVar(&f.probeEvery, "upstream-probe-interval", defaultProbeEvery, "how often a TCP connect checks that the upstream is reachable, for /readyz (ready while the newest evidence, probe or traffic, is a success and younger than 3 intervals); 0 judges by traffic alone")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error (one info line per request)")
	fs.DurationVar(&f.shutdownGrace, "shutdown-grace", 30*time.Second, "on SIGTERM/SIGINT, how long in-flight streams may take to finish; a second signal exits at once")
	fs.StringVar(&f.models, "models", "", "comma-separated model names allowed as metric labels; others are labelled \"other\" (default: learn the first --max-models names seen)")
	c := &f.cfg
	fs.IntVar(&c.MaxModels, "max-models", proxy.DefaultMaxModels, "how many model labels to learn when --models is empty")
	fs.IntVar(&c.MaxBodyBytes, "max-body-bytes", proxy.DefaultMaxBodyBytes, "largest request body in bytes; larger gets 413")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", proxy.DefaultMaxHeaderBytes, "largest request or response header block in bytes; larger request headers get 431")
	fs.DurationVar(&c.ReadTimeout, "read-timeout", proxy.DefaultReadTimeout, "total time to read one request (headers and body) from a client; cuts slowloris clients")
	fs.DurationVar(&c.ClientWriteTimeout, "client-write-timeout", proxy.DefaultClientWriteTimeout, "idle timeout per write to a client; never limits a healthy stream's length")
	fs.DurationVar(&c.UpstreamReadTimeout, "upstream-read-timeout", proxy.DefaultUpstreamReadTimeout, "idle timeout per read from the upstream, including the wait for headers (queue + prefill); 504 before headers")
	fs.DurationVar(&c.DialTimeout, "dial-timeout", proxy.DefaultDialTimeout, "timeout for connecting to the upstream; 502 when it fails")
	fs.IntVar(&c.MaxUpstreamConns, "max-upstream-conns", proxy.DefaultMaxUpstreamConns, "most upstream connections (each stream holds one for its whole generation)")
	fs.DurationVar(&c.UpstreamIdleTimeout, "upstream-idle-timeout", proxy.DefaultUpstreamIdleTimeout, "close an idle upstream connection after this long; keep it below the engine's keep-alive timeout (uvicorn, in front of vLLM and SGLang: 5s)")
	fs.IntVar(&c.MaxClientConns, "max-conns", 0, "most client connections on --listen; one more gets 503 and is closed (0: derived from the file-descriptor limit, half of it less a reserve, since each stream also holds an upstream connection)")
	fs.Int64Var(&c.MaxInflightBodyBytes, "max-inflight-body-bytes", proxy.DefaultMaxInflightBody, "most request-body bytes held in memory at once, all requests together; a request over it gets 503 with Retry-After")
	fs.DurationVar(&c.MaxConnWait, "max-conn-wait", proxy.DefaultMaxConnWait, "how long a request waits for a free upstream connection before 503")
	fs.IntVar(&c.MaxInflight, "max-inflight", 0, "local concurrency limit: at most N requests upstream, the rest wait FIFO (set to the engine's slots to measure queueing exactly); 0 disables")
	fs.IntVar(&c.MaxQueue, "max-queue", proxy.DefaultMaxQueue, "with --max-inflight: requests that may wait; one more gets 429")
	fs.DurationVar(&c.MaxQueueWait, "max-queue-wait", proxy.DefaultMaxQueueWait, "with --max-inflight: longest wait for a slot before 503")
	fs.BoolVar(&c.EventLoop, "event-loop", proxy.DefaultEventLoop, "relay streamed responses on a few epoll event loops instead of one goroutine per connection (Linux; docs/design.md \"The event-loop relay\")")
	fs.BoolVar(&c.InjectUsage, "inject-usage", false, "add stream_options.include_usage=true upstream when a streamed chat/completions request lacks it, and hide the extra usage event from the client")
	fs.DurationVar(&c.RetryWindow, "retry-window", retry.DefaultWindow, "how long after an attempt the same body from the same client counts as a retry")
	fs.Int64Var(&c.RetryMaxBytes, "retry-max-bytes", retry.DefaultMaxBytes, "memory cap of the retry tracker's index, bytes")
	fs.BoolVar(&c.NoForwardedFor, "no-forwarded-for", false, "do not append the client address to X-Forwarded-For")
	fs.BoolVar(&c.PreserveHost, "preserve-host", false, "send the client's Host header upstream instead of the upstream's")
	fs.BoolVar(&c.InsecureSkipVerify, "insecure-skip-verify", false, "do not verify an https upstream's certificate")
	fs.Int64Var(&c.PrefixMaxBytes, "prefix-max-bytes", prefix.DefaultMaxIndexBytes, "memory cap of the prompt-prefix index, bytes (about 1.3 bytes per distinct prompt byte)")
	fs.Var((*listFlag)(&c.VolatileFields), "volatile-field", "JSON key path masked before prefix hashing (e.g. metadata.timestamp); repeatable")
	fs.Var((*listFlag)(&c.VolatilePatterns), "volatile-pattern", "regular expression on prompt text masked before prefix hashing (e.g. a timestamp); repeatable")
}

func runServe(args []string, stderr io.Writer) error {
	fs := newFlagSet("serve", "", stderr)
	var f serveFlags
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := loadConfig(fs, f.config); err != nil {
		return err
	}
	log, stopLog, err := newBufferedLogger(stderr, f.logLevel)
	if err != nil {
		return err
	}
	defer stopLog()

	st, err := startStack(&f, log)
	if err != nil {
		return err
	}
	logListeners(log, st)
	log.Info("anvilproxy serving", zap.String("listen", st.ln.Addr().String()), zap.String("upstream", st.upstream),
		zap.String("admin", st.adminAddr), zap.String("snapshot_dir", f.snapshot.Dir))
	err = serveUntilSignal(st.proxy, st.ln, f.shutdownGrace, log)
	// The proxy has drained: the last window is whole.
	if cerr := st.close(); cerr != nil {
		log.Error("final snapshot", zap.Error(cerr))
	}
	return err
}

// stack is serve's wiring, shared by serve and demo: the proxy with its
// data listener (not yet served), the Recorder and its registry, the
// snapshot Writer (started), the admin listener (serving) and, with
// --upstream sim, the embedded engine.
type stack struct {
	proxy     *proxy.Proxy
	ln        net.Listener // the data listener; the caller serves it
	reg       *prometheus.Registry
	rec       *histo.Recorder
	snaps     *snapshot.Writer
	tap       *tap            // between the proxy and rec: outcomes, reachability, hints
	health    *upstreamHealth // /readyz
	upstream  string          // the upstream in use: the embedded engine's URL with --upstream sim
	started   time.Time
	slos      string             // --slo, in flag form
	baseline  *snapshot.Document // --baseline, merged; nil without one (read-only)
	snapEvery time.Duration      // --snapshot-interval: the snapshot window's length

	proxyURL, adminURL string // http://host:port; adminURL is "" without an admin listener
	adminAddr          string // the admin listener's bound address; "" without one

	stops []func() // run in reverse order by close
}

// startStack builds the stack that f describes. On error, whatever it
// started is stopped again.
func startStack(f *serveFlags, log *zap.Logger) (_ *stack, err error) {
	st := &stack{started: time.Now(), slos: f.slos.String(), snapEvery: f.snapshot.Interval}
	if st.snapEvery <= 0 {
		st.snapEvery = snapshot.DefaultInterval
	}
	if st.baseline, err = loadBaseline(f.baseline); err != nil {
		return nil, fmt.Errorf("--baseline: %w", err)
	}
	defer func() {
		if err != nil {
			st.stop()
		}
	}()
	cfg := f.cfg
	cfg.Upstream = f.upstream
	setMemoryLimit(cfg, log)
	if f.models != "" {
		cfg.Models = strings.Split(f.models, ",")
	}
	if f.upstream != embeddedUpstream {
		up, err := checkUpstream(f.upstream)
		if err != nil {
			return nil, err
		}
		if endsInV1(up.Prefix) {
			log.Warn(v1Hint(redacted(f.upstream)), zap.String("upstream", redacted(f.upstream)))
		}
	}
	if f.upstream == embeddedUpstream {
		addr, stop, err := startEmbeddedSim(f.sim)
		if err != nil {
			return nil, err
		}
		st.stops = append(st.stops, stop)
		cfg.Upstream = "http://" + addr
		log.Warn("no --upstream given: serving the simulated engine", zap.String("sim", cfg.Upstream))
	}
	st.upstream = redacted(cfg.Upstream)
	if cfg.MaxClientConns == 0 {
		cfg.MaxClientConns = raiseFileLimit(log)
	}
	hcfg := f.histo
	hcfg.SLOs = f.slos
	hcfg.Inflight = func() int64 { return st.proxy.Inflight() }
	hcfg.RetryStats = func() retry.Stats { return st.proxy.Retries().Stats() }
	hcfg.Log = log
	st.reg = prometheus.NewRegistry()
	st.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if st.rec, err = histo.New(hcfg, st.reg); err != nil {
		return nil, err
	}
	st.rec.SelfCheck().Start()
	st.stops = append(st.stops, st.rec.SelfCheck().Stop)
	up, err := checkUpstream(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	st.health = newUpstreamHealth(redacted(cfg.Upstream), f.probeEvery, log)
	st.tap = &tap{next: st.rec, first: st.rec, health: st.health, log: log, upstream: redacted(cfg.Upstream), v1: endsInV1(up.Prefix)}
	if st.proxy, err = proxy.New(cfg, log, st.tap); err != nil {
		return nil, err
	}
	registerProxyStats(st.reg, st.proxy.Stats())
	_, stopScraper, err := startEngineScraper(f.engine, cfg.Upstream, st.rec, st.reg, log)
	if err != nil {
		return nil, err
	}
	st.stops = append(st.stops, stopScraper)
	st.startProbes(up, cfg)
	if st.snaps, err = snapshot.NewWriter(f.snapshot, st.rec, st.reg, log); err != nil {
		return nil, err
	}
	if st.ln, err = net.Listen("tcp", f.listen); err != nil {
		return nil, bindError("--listen", f.listen, "the agents' address", err)
	}
	st.stops = append(st.stops, func() { st.ln.Close() })
	st.proxyURL = "http://" + st.ln.Addr().String()
	if f.adminListen != "" {
		addr, stop, err := startAdmin(f.adminListen, adminMux(st, f.adminToken), log)
		if err != nil {
			return nil, bindError("--admin-listen", f.adminListen, "the dashboard's and /metrics' address; empty disables it", err)
		}
		st.stops = append(st.stops, stop)
		st.adminAddr, st.adminURL = addr, "http://"+addr
	}
	st.snaps.Start()
	return st, nil
}

// bindError names the flag behind a listener that could not bind, so that
// "address already in use" says which port to change.
func bindError(flagName, addr, what string, err error) error {
	hint := ""
	if errors.Is(err, syscall.EADDRINUSE) {
		hint = ": another process listens there; choose a free one"
	}
	return fmt.Errorf("%s %s (%s) cannot be used: %w%s", flagName, addr, what, err, hint)
}

// close writes the final snapshot (call it once the proxy has drained, so
// that the last window is whole) and stops the admin listener and the
// embedded engine. It returns the final snapshot's error.
func (st *stack) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), finalSnapshotTimeout)
	defer cancel()
	err := st.snaps.Close(ctx)
	st.stop()
	return err
}

// stop runs the stop functions, newest first.
func (st *stack) stop() {
	for i := len(st.stops) - 1; i >= 0; i-- {
		st.stops[i]()
	}
	st.stops = nil
}

// finalSnapshotTimeout bounds the wait for the final snapshot at shutdown,
// so that a hung disk cannot hold the process.
const finalSnapshotTimeout = 10 * time.Second

// serveUntilSignal serves until SIGTERM or SIGINT, then drains in-flight
// requests for up to grace; a second signal exits at once.
func serveUntilSignal(p *proxy.Proxy, ln net.Listener, grace time.Duration, log *zap.Logger) error {
	srv := p.Server()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(p.Listener(ln)) }()

	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigc)
	select {
	case err := <-errc:
		return err
	case sig := <-sigc:
		log.Info("shutting down", zap.Stringer("signal", sig), zap.Int64("inflight", p.Inflight()), zap.Duration("grace", grace))
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	go func() {
		secondSignal(sigc, time.Now(), time.After(signalEcho), log)
		log.Warn("second signal: exiting at once")
		_ = log.Sync()
		os.Exit(1)
	}()
	p.Drain() // a stream the event loop ends from now on closes its client connection
	err := srv.ShutdownWithContext(ctx)
	if err == nil {
		// fasthttp stops counting a connection once it is hijacked: the
		// tunnels and HTTP/1.0 streams are waited for here, within the grace.
		err = waitDrained(ctx, p)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		abortInflight(p, log)
		return nil
	}
	if err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// signalEcho is how long after the first signal another one is the same
// request. GNU timeout sends its signal to the command and then to the
// whole process group (timeout.c, cleanup: send_sig to the child, then
// send_sig (0, sig) unless --foreground), so the proxy under "timeout"
// gets SIGTERM twice, microseconds apart; a supervisor that signals a
// process and its cgroup does the same. A person's second Ctrl-C comes
// later than this.
const signalEcho = time.Second

// secondSignal returns at the first signal on sigc after echoEnd fires;
// those before it are the first signal's echo and are logged, not obeyed.
func secondSignal(sigc <-chan os.Signal, first time.Time, echoEnd <-chan time.Time, log *zap.Logger) {
	for {
		select {
		case sig := <-sigc:
			log.Info("signal again at once: the same request (timeout signals the process and its group); a later one exits at once",
				zap.Stringer("signal", sig), zap.Duration("after", time.Since(first)))
			continue
		case <-echoEnd:
			log.Debug("a second signal now exits at once")
		}
		<-sigc
		return
	}
}

// waitDrained waits until every request in flight has recorded its Trace,
// or ctx ends.
func waitDrained(ctx context.Context, p *proxy.Proxy) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for p.Inflight() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// abortDrain bounds the wait, after Abort, for the cut requests to record
// their Traces.
const abortDrain = 2 * time.Second

// abortInflight ends the requests still running when the shutdown grace
// ran out: their upstream connections are closed, so each ends as a failed
// request of kind shutdown, logged, counted and in the final snapshot,
// which the caller writes next. The exit stays 0: the grace ending is the
// operator's choice (as with nginx's worker_shutdown_timeout).
func abortInflight(p *proxy.Proxy, log *zap.Logger) {
	n := p.Inflight()
	p.Abort()
	deadline := time.Now().Add(abortDrain)
	for p.Inflight() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	log.Warn("shutdown grace expired: requests still in flight were cut", zap.Int64("cut", n), zap.Int64("unfinished", p.Inflight()))
}

// defaultProbeEvery is --upstream-probe-interval's default.
const defaultProbeEvery = 5 * time.Second

// startProbes checks the upstream once over HTTP (in the background, so
// that a slow upstream does not hold the start) and then, with a probe
// interval, by TCP connect until the stack stops.
func (st *stack) startProbes(up proxy.Upstream, cfg proxy.Config) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = proxy.DefaultDialTimeout
	}
	go func() {
		defer close(done)
		st.health.startProbe(ctx, cfg.Upstream, up.Prefix, timeout+startProbeWait, cfg.InsecureSkipVerify)
		if st.health.every > 0 {
			st.health.probeLoop(ctx, up.Addr, timeout)
		}
	}()
	st.stops = append(st.stops, func() { cancel(); <-done })
}

// startProbeWait is how long the start probe waits for an answer once
// connected.
const startProbeWait = 5 * time.Second

// startEmbeddedSim starts the simulated engine on a loopback port.
func startEmbeddedSim(cfg sim.Config) (addr string, stop func(), err error) {
	s, err := sim.New(cfg)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listening for the simulated engine: %w", err)
	}
	// Like engines behind uvicorn, it closes idle connections after 5 s.
	hs := s.HTTPServer()
	go hs.Serve(ln) //nolint:errcheck // ends with Close
	return ln.Addr().String(), func() { hs.Close() }, nil
}
