package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo/snapshot"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

type demoFlags struct {
	duration    time.Duration
	agents      int
	listen      string
	adminListen string
	snapshotDir string
	interval    time.Duration
	seed        int64
	slos        sloFlag
	logLevel    string
}

// Where the demo listens when it may: the ports of serve's defaults, on
// loopback only. When one is taken, a free loopback port is used instead.
const (
	demoTruncateRate = 0.03 // share of the engine's streams that end unfinished
	demoListen       = "127.0.0.1:8080"
	demoAdminListen  = "127.0.0.1:9464"
	demoSLOs         = "ttft=3s,tpot=50ms"
)

func (f *demoFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.duration, "duration", time.Minute, "how long the agents run; Ctrl-C ends the demo early, just as cleanly")
	fs.IntVar(&f.agents, "agents", 8, "simulated coding agents; the simulated engine has 4 slots, so more than 4 queue")
	fs.StringVar(&f.listen, "listen", "", "address of the proxy (default "+demoListen+" when free, else a free loopback port)")
	fs.StringVar(&f.adminListen, "admin-listen", "", "address of the dashboard, /metrics and /snapshot (default "+demoAdminListen+" when free, else a free loopback port)")
	fs.StringVar(&f.snapshotDir, "snapshot-dir", "", "directory for the snapshot files (default: a new temporary directory, kept after the demo)")
	fs.DurationVar(&f.interval, "snapshot-interval", 30*time.Second, "length of a measurement window: one snapshot file each")
	fs.Int64Var(&f.seed, "seed", 1, "seed of the agents' prompts, sizes and timing choices, and of the simulated engine")
	fs.Var(&f.slos, "slo", "goodput objectives, metric=duration, as for serve (default "+demoSLOs+")")
	fs.StringVar(&f.logLevel, "log-level", "error", "log level of the proxy's log on stderr")
}

// runDemo runs the simulated engine, the proxy in front of it and a
// synthetic coding-agent workload on loopback, prints a live table, then
// the snapshot files and their report.
func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "", stderr)
	var f demoFlags
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if f.agents < 1 || f.duration <= 0 {
		fmt.Fprintln(stderr, "anvilproxy demo: --agents and --duration must be positive")
		return errUsage
	}
	if len(f.slos) == 0 {
		if err := f.slos.Set(demoSLOs); err != nil {
			return err
		}
	}
	log, err := newLogger(stderr, f.logLevel)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d, err := startDemo(&f, log)
	if err != nil {
		return err
	}
	d.printStart(stdout)
	ctx, cancel := context.WithTimeout(ctx, f.duration)
	defer cancel()
	d.live(ctx, stdout)
	stop() // a second Ctrl-C ends the process at once
	return d.finish(stdout, stderr)
}

// demo is a running demo: the stack of serve, serving, and the agents.
type demo struct {
	f       *demoFlags
	st      *stack
	srv     *fasthttp.Server
	served  chan error
	dir     string // the snapshot directory
	w       *workload
	soft    context.CancelFunc // no new turns
	hard    context.CancelFunc // abandon the turns in progress
	started time.Time
}

// startDemo starts the simulated engine, the proxy with its admin listener
// and snapshot writer, and the agents.
func startDemo(f *demoFlags, log *zap.Logger) (*demo, error) {
	var sf serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	sf.register(fs) // serve's defaults
	sf.listen = orFree(f.listen, demoListen)
	sf.adminListen = orFree(f.adminListen, demoAdminListen)
	sf.slos = f.slos
	sf.snapshot.Interval = f.interval
	sf.snapshot.Dir = f.snapshotDir
	if sf.snapshot.Dir == "" {
		dir, err := os.MkdirTemp("", "anvilproxy-demo-")
		if err != nil {
			return nil, err
		}
		sf.snapshot.Dir = dir
	}
	// The engine reports its own queue time, as vLLM does with per-request
	// metrics, so the waterfall splits queue from prefill exactly. It closes
	// idle connections after 5 s, as uvicorn does, and ends a few streams
	// unfinished, as ollama does.
	sf.sim = sim.Config{Seed: f.seed, Timings: sim.TimingVLLM, TruncateRate: demoTruncateRate}
	st, err := startStack(&sf, log)
	if err != nil {
		return nil, err
	}
	srv := st.proxy.Server()
	d := &demo{f: f, st: st, srv: srv, served: make(chan error, 1), dir: sf.snapshot.Dir, started: time.Now()}
	go func() { d.served <- srv.Serve(st.ln) }()
	soft, softCancel := context.WithCancel(context.Background())
	hard, hardCancel := context.WithCancel(context.Background())
	d.soft, d.hard = softCancel, hardCancel
	d.w = startWorkload(soft, hard, st.proxyURL, f.agents, f.seed)
	return d, nil
}

// orFree returns addr when set; else def when it is free to listen on,
// else a free loopback port.
func orFree(addr, def string) string {
	if addr != "" {
		return addr
	}
	ln, err := net.Listen("tcp", def)
	if err != nil {
		return "127.0.0.1:0"
	}
	ln.Close()
	return def
}

func (d *demo) printStart(w io.Writer) {
	c := simDefaults()
	fmt.Fprintf(w, "anvilproxy demo: %d simulated coding agents for %s against the simulated engine\n", d.f.agents, d.f.duration)
	fmt.Fprintf(w, "  (%d slots, %.0f prompt tokens/s prefill, %.0f tokens/s decode per stream; Ctrl-C ends it early)\n",
		c.Slots, c.PrefillTokensPerSec, c.DecodeTokensPerSec)
	fmt.Fprintf(w, "  (answers stop by themselves after %d-%d tokens; idle connections closed after %s; %.0f%% of streams end unfinished)\n\n",
		c.NaturalLengths[0], c.NaturalLengths[len(c.NaturalLengths)-1], c.KeepAliveTimeout, demoTruncateRate*100)
	fmt.Fprintf(w, "  proxy      %s/v1   (point your own agent here too)\n", d.st.proxyURL)
	fmt.Fprintf(w, "  dashboard  %s/\n", d.st.adminURL)
	fmt.Fprintf(w, "  metrics    %s/metrics\n", d.st.adminURL)
	fmt.Fprintf(w, "  snapshots  %s (one file per %s window)\n\n", d.dir, d.f.interval)
}

// simDefaults is the simulated engine's calibrated configuration.
func simDefaults() sim.Config {
	s, err := sim.New(sim.Config{})
	if err != nil {
		panic("BUG: the default sim.Config is invalid: " + err.Error())
	}
	return s.Config()
}

// finish stops the agents (the turns in progress may end, for a few
// seconds), drains the proxy, writes the final snapshot and reports.
func (d *demo) finish(stdout, stderr io.Writer) error {
	d.soft()
	done := make(chan struct{})
	go func() { d.w.wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drainAgents):
		d.hard()
		<-done
	}
	d.hard()
	ctx, cancel := context.WithTimeout(context.Background(), drainAgents)
	defer cancel()
	if err := d.srv.ShutdownWithContext(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(stderr, "anvilproxy demo: shutting down the proxy: %v\n", err)
	}
	if err := <-d.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "anvilproxy demo: proxy: %v\n", err)
	}
	if err := d.st.close(); err != nil {
		return err
	}
	s := d.st.status(time.Now()) // after the drain: the counts of the report below
	fmt.Fprintf(stdout, "\ndemo finished after %s: %s; the agents: %s answered, %d ended unfinished and re-sent, %d given up\n",
		time.Since(d.started).Round(100*time.Millisecond), s.countsText(), plural(d.w.turns.Load(), "turn"), d.w.truncated.Load(), d.w.failed.Load())
	files, err := snapshotFiles(d.dir)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		fmt.Fprintf(stdout, "no snapshot written: no request finished\n")
		return nil
	}
	fmt.Fprintf(stdout, "snapshots: %s in %s\n\n$ anvilproxy report %s\n",
		plural(int64(len(files)), "file"), d.dir, filepath.Join(d.dir, "anvilproxy-*.json"))
	return runReport(files, stdout, stderr)
}

// drainAgents bounds the wait for the agents' last turns and for the
// proxy's drain at the end of the demo.
const drainAgents = 5 * time.Second

// snapshotFiles lists the snapshot files in dir, oldest first.
func snapshotFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Type().IsRegular() && snapshot.IsSnapshotName(e.Name()) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}
