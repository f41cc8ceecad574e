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
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy/bench"
)

// childProfileFlag makes "anvilproxy bench" run serve with a CPU profile
// written when it exits and a heap profile written on SIGUSR1: the bench
// starts its anvilproxy child this way for --proxy-cpuprofile and
// --proxy-memprofile, since serve has no profiling of its own. Its two
// arguments are the profiles' paths, "" for none; serve's flags follow.
const childProfileFlag = "--as-profiled-serve"

// floorRelayFlag makes "anvilproxy bench" run the floor relay
// (bench.RunFloorRelay) on its two arguments, the listen and upstream
// addresses: the bench's floor target.
const floorRelayFlag = "--as-floor-relay"

// httpFloorFlag makes "anvilproxy bench" run the fasthttp floor
// (bench.RunHTTPFloor) the same way: the bench's floor-http target.
const httpFloorFlag = "--as-http-floor"

type benchFlags struct {
	quick      bool
	jsonOut    string
	streams    string
	events     int
	gap        time.Duration
	targets    string
	baseBinary string
	capacity   string
	cpuProfile string
	memProfile string
	proxyFlags listFlag
	cfg        bench.Config
}

func (f *benchFlags) register(fs *flag.FlagSet) {
	d := bench.DefaultConfig()
	c := &f.cfg
	fs.BoolVar(&f.quick, "quick", false, "smoke run, under a minute on 2 cores: 16 and 256 streams, 2 rounds, a short throughput test (flags given explicitly still apply)")
	fs.StringVar(&f.jsonOut, "json", "", "also write the report as JSON to FILE")
	fs.StringVar(&f.streams, "streams", "", "comma-separated stream concurrencies (default 16,256,1000; with --quick 16,256)")
	fs.IntVar(&f.events, "events", 0, "content events per stream, every level (default: 200 at 16 streams, 60 at 256, 20 at 1000)")
	fs.DurationVar(&f.gap, "gap", 0, "time between a stream's events, every level (default: 5ms at 16 streams, 20ms at 256, 50ms at 1000: 3,200, 12,800 and 20,000 events/s offered)")
	fs.IntVar(&c.EventBytes, "event-bytes", d.EventBytes, fmt.Sprintf("size of one SSE event on the wire, in bytes (at least %d)", bench.MinEventBytes))
	fs.IntVar(&c.Rounds, "rounds", 0, fmt.Sprintf("interleaved rounds per stream level (default %d; --quick 2)", d.Rounds))
	fs.DurationVar(&c.Cell, "round", 0, fmt.Sprintf("how long the clients keep starting streams in one round (default %v; --quick 600ms)", d.Cell))
	fs.IntVar(&c.SmallWorkers, "non-stream-clients", d.SmallWorkers, "closed-loop clients of the non-stream throughput test")
	fs.IntVar(&c.SmallRounds, "non-stream-rounds", 0, fmt.Sprintf("interleaved rounds of the throughput test (default %d; --quick 2); -1 skips it", d.SmallRounds))
	fs.DurationVar(&c.SmallCell, "non-stream-round", 0, fmt.Sprintf("length of one throughput round (default %v; --quick 500ms)", d.SmallCell))
	fs.StringVar(&f.targets, "targets", "", "comma-separated targets to run besides direct: anvilproxy (serve as it runs by default: the event loop on Linux), anvilproxy-base (--base-binary's serve, run the same way; only with that flag), anvilproxy-goroutine (serve --event-loop=false), floor (a Go epoll relay that measures nothing), floor-http (a fasthttp reverse proxy that measures nothing), nginx, caddy, haproxy (default: all installed)")
	fs.StringVar(&f.baseBinary, "base-binary", "", "also run FILE, another anvilproxy binary (e.g. built from an earlier commit), as the anvilproxy-base target: serve with the same flags as anvilproxy, in the same interleaved rounds, to A/B a change in one run")
	fs.StringVar(&c.ProxyLogLevel, "proxy-log-level", d.ProxyLogLevel, "anvilproxy's --log-level; info (serve's default) logs one line per request")
	fs.StringVar(&f.cpuProfile, "proxy-cpuprofile", "", "write a CPU profile of the anvilproxy child to FILE (go tool pprof FILE); costs the proxy a little CPU")
	fs.Var(&f.proxyFlags, "proxy-flag", "pass one more flag to anvilproxy serve, e.g. --proxy-flag=--max-header-bytes=16384 (repeatable; the table's setup line lists them)")
	fs.StringVar(&f.memProfile, "proxy-memprofile", "", "write a heap profile of the anvilproxy child to FILE while the capacity run holds every stream open (its last wave); needs --capacity")
	fs.StringVar(&f.capacity, "capacity", "", "hold N slow streams open at once through anvilproxy, anvilproxy-goroutine, then nginx, and report their memory per stream; a comma-separated list (1000,10000) runs each; alone, runs only that")
	fs.IntVar(&c.CapacityEvents, "capacity-events", d.CapacityEvents, "events per stream of the capacity run")
	fs.DurationVar(&c.CapacityGap, "capacity-gap", d.CapacityGap, "time between events in the capacity run")
	fs.DurationVar(&c.CapacityRamp, "capacity-ramp", d.CapacityRamp, "how long opening the capacity run's streams takes")
}

// benchUsage is what "anvilproxy bench --help" prints before the flags.
const benchUsage = "Usage: anvilproxy bench [--quick] [--json FILE] [flags]\n\n" +
	"Measures what anvilproxy adds to a stream, side by side with a direct connection and with\n" +
	"nginx, Caddy and HAProxy when installed (scripts/install-comparison-proxies.sh), in\n" +
	"interleaved rounds. Progress goes to stderr, the table to stdout.\n\n"

// runBench measures the proxy's own overhead (BENCHMARKS.md "Method"). The proxy
// runs as a child process, "anvilproxy serve", so that its CPU time is its
// own; the emitter and the clients run here.
func runBench(args []string, stdout, stderr io.Writer) error {
	if len(args) >= 3 && args[0] == childProfileFlag {
		return runProfiledServe(args[1], args[2], args[3:], stderr)
	}
	if len(args) == 3 && (args[0] == floorRelayFlag || args[0] == httpFloorFlag) {
		return runFloorRelay(args[0] == httpFloorFlag, args[1], args[2])
	}
	fs := newFlagSet("bench", benchUsage, stderr)
	var f benchFlags
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := f.config(fs)
	if err != nil {
		fmt.Fprintf(stderr, "anvilproxy bench: %v\n", err)
		return errUsage
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the anvilproxy binary: %w", err)
	}
	if err := f.setArgv(&cfg, exe); err != nil {
		return err
	}
	cfg.Command = "anvilproxy bench " + strings.Join(args, " ")
	cfg.Progress = stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if f.jsonOut != "" {
		if err := writeBenchJSON(f.jsonOut, rep); err != nil {
			return err
		}
	}
	// Timings never fail the command (they depend on the machine); an
	// anvilproxy that does not start, or loses, reorders or corrupts an
	// event, does.
	if why := rep.Skipped(bench.AnvilProxy); why != "" {
		return fmt.Errorf("anvilproxy did not run: %s", why)
	}
	for _, t := range []string{bench.AnvilProxy, bench.AnvilGoroutine} {
		if !rep.Intact(t) {
			return fmt.Errorf("%s did not deliver every event intact: see the table", t)
		}
	}
	return nil
}

// setArgv sets the commands that run the bench's children from the
// binary exe: the anvilproxy target is serve as it runs by default
// (proxy.DefaultEventLoop), profiled if asked (--proxy-flag=--event-loop=false
// profiles the goroutine relay); the anvilproxy-goroutine target is serve
// --event-loop=false, after the --proxy-flags so that it stays the
// goroutine relay whatever they say.
func (f *benchFlags) setArgv(cfg *bench.Config, exe string) error {
	cfg.FloorArgv = []string{exe, "bench", floorRelayFlag}
	cfg.HTTPFloorArgv = []string{exe, "bench", httpFloorFlag}
	cfg.GoroutineArgv = append(append([]string{exe, "serve"}, f.proxyFlags...), "--event-loop=false")
	cfg.ProxyArgv = []string{exe, "serve"}
	if f.cpuProfile != "" || f.memProfile != "" {
		cpu, err := absOrEmpty(f.cpuProfile) // the child runs in a temporary directory
		if err != nil {
			return err
		}
		mem, err := absOrEmpty(f.memProfile)
		if err != nil {
			return err
		}
		cfg.ProxyArgv = []string{exe, "bench", childProfileFlag, cpu, mem}
		cfg.HeapProfile = mem != ""
	}
	cfg.ProxyArgv = append(cfg.ProxyArgv, f.proxyFlags...)
	cfg.BaseArgv = nil
	if f.baseBinary != "" {
		base, err := filepath.Abs(f.baseBinary) // the child runs in a temporary directory
		if err != nil {
			return err
		}
		cfg.BaseArgv = append([]string{base, "serve"}, f.proxyFlags...)
	}
	return nil
}

// config builds the bench.Config from the flags.
func (f *benchFlags) config(fs *flag.FlagSet) (bench.Config, error) {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	base := bench.DefaultConfig()
	if f.quick {
		base = bench.QuickConfig()
	}
	cfg := f.cfg
	cfg.Levels = base.Levels
	if cfg.Rounds == 0 {
		cfg.Rounds = base.Rounds
	}
	if cfg.Cell == 0 {
		cfg.Cell = base.Cell
	}
	if cfg.SmallRounds == 0 {
		cfg.SmallRounds = base.SmallRounds
	}
	if cfg.SmallCell == 0 {
		cfg.SmallCell = base.SmallCell
	}
	if f.streams != "" {
		levels, err := parseLevels(f.streams, base.Levels)
		if err != nil {
			return cfg, err
		}
		cfg.Levels = levels
	}
	for i := range cfg.Levels {
		if f.events > 0 {
			cfg.Levels[i].Events = f.events
		}
		if f.gap > 0 {
			cfg.Levels[i].Gap = f.gap
		}
	}
	if f.targets != "" {
		cfg.Targets = strings.Split(f.targets, ",")
	}
	if err := f.checkBase(); err != nil {
		return cfg, err
	}
	if f.capacity != "" {
		for _, part := range strings.Split(f.capacity, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(part))
			if err != nil || n <= 0 {
				return cfg, fmt.Errorf("--capacity: %q is not a positive number of streams", part)
			}
			cfg.Capacity = append(cfg.Capacity, n)
		}
	}
	cfg.NoStreams = len(cfg.Capacity) > 0 && !set["streams"] && !set["quick"]
	return cfg, nil
}

// checkBase fails, before any round runs, for a --base-binary that is
// not an executable file (bench.Run fails for the anvilproxy-base target
// asked for without one).
func (f *benchFlags) checkBase() error {
	if f.baseBinary == "" {
		return nil
	}
	if err := bench.CheckBinary(f.baseBinary); err != nil {
		return fmt.Errorf("--base-binary: %w", err)
	}
	return nil
}

// parseLevels reads "1,64,1000". A concurrency takes the events and gap
// of base's level of that size, or else of the largest default level not
// above it.
func parseLevels(s string, base []bench.Level) ([]bench.Level, error) {
	full := bench.DefaultConfig().Levels
	var out []bench.Level
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--streams %q: want positive integers", s)
		}
		lv := full[0]
		for _, d := range full {
			if d.Streams <= n {
				lv = d
			}
		}
		for _, d := range base {
			if d.Streams == n {
				lv = d
			}
		}
		lv.Streams = n
		out = append(out, lv)
	}
	return out, nil
}

func writeBenchJSON(name string, rep *bench.Report) error {
	if err := createFile(name, rep.WriteJSON); err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	return nil
}

// createFile creates path and writes it with write; the first error of
// the creation, the write and the close is the error.
func createFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func absOrEmpty(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	return filepath.Abs(path)
}

// runProfiledServe runs serve with a CPU profile of the whole run written
// to cpuPath when serve returns (after SIGTERM and the drain), and a heap
// profile written to memPath, after a GC, each time bench.HeapSignal (SIGUSR1) arrives.
// Either path may be empty.
func runProfiledServe(cpuPath, memPath string, args []string, stderr io.Writer) error {
	if memPath != "" && bench.HeapSignal != nil {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, bench.HeapSignal)
		defer signal.Stop(sig)
		go func() {
			for range sig {
				if err := writeHeapProfile(memPath); err != nil {
					fmt.Fprintf(stderr, "heap profile: %v\n", err)
				}
			}
		}()
	}
	if cpuPath == "" {
		return runServe(args, stderr)
	}
	out, err := os.Create(cpuPath)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return fmt.Errorf("cpu profile: %w", err)
	}
	err = runServe(args, stderr)
	pprof.StopCPUProfile()
	return errors.Join(err, out.Close())
}

// runFloorRelay serves the floor relay, or the fasthttp floor if http,
// until SIGTERM or SIGINT.
func runFloorRelay(http bool, listen, upstream string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		ln.Close()
	}()
	if http {
		return bench.RunHTTPFloor(ln, upstream, 4096)
	}
	return bench.RunFloorRelay(ln, upstream, 0)
}

func writeHeapProfile(path string) error {
	runtime.GC() // the profile shows the heap as of the last GC
	return createFile(path, pprof.WriteHeapProfile)
}
