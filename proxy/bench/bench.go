// Package bench measures what anvilproxy costs a client, side by side with
// a direct connection and with other reverse proxies found on the machine
// (nginx, Caddy, HAProxy), in one run.
//
// The method follows GetBusbar's stream suite (BENCHMARKS.md "Method"):
// an emitter on loopback sends SSE events that carry their send time; the
// clients stamp each event when the read that completes it returns; the
// same workload runs direct and through every proxy in interleaved rounds
// (direct, anvilproxy, nginx, caddy, haproxy, direct, ...), so that drift
// of the machine hits every target alike; and every figure is reported
// against the direct run of the same invocation. The emitter and the
// clients run in the bench process; each proxy runs as its own process, so
// its CPU time is its own.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"time"
)

// Level is one concurrency of the stream test.
type Level struct {
	// Streams is the number of streams open at once.
	Streams int
	// Events is the number of content events per stream.
	Events int
	// Gap is the time between a stream's events.
	Gap time.Duration
}

// offered is the event rate the level asks of a target, events/s.
func (l Level) offered() float64 { return float64(l.Streams) / l.Gap.Seconds() }

// streamTime is how long one stream lasts at the emitter.
func (l Level) streamTime() time.Duration { return time.Duration(l.Events-1) * l.Gap }

// Config is one bench run. Zero fields take the values of DefaultConfig.
type Config struct {
	// Levels are the stream concurrencies, run one after the other.
	Levels []Level
	// Rounds is the number of interleaved rounds per level.
	Rounds int
	// Cell is how long each client keeps starting new streams in one round
	// (a stream started is always finished); at least three streams' time.
	Cell time.Duration
	// EventBytes is the size of one event on the wire, "data: " to the
	// blank line; at least MinEventBytes.
	EventBytes int

	// SmallWorkers is the number of closed-loop clients of the non-stream
	// throughput test.
	SmallWorkers int
	// SmallRounds is the number of interleaved rounds of the throughput
	// test; negative skips it.
	SmallRounds int
	// SmallCell is the length of one throughput round.
	SmallCell time.Duration

	// Capacity lists the capacity runs: each is a number of slow streams
	// held open at once through each proxy in turn. Empty skips it.
	Capacity []int
	// CapacityEvents and CapacityGap shape the capacity run's streams.
	CapacityEvents int
	CapacityGap    time.Duration
	// CapacityRamp is how long opening a capacity run's streams takes.
	CapacityRamp time.Duration

	// ProxyArgv runs "anvilproxy serve" as it runs by default (the
	// AnvilProxy target; the one profiled); the bench appends --upstream,
	// --listen, --admin-listen, --log-level, --max-upstream-conns and
	// --shutdown-grace. Empty skips anvilproxy.
	ProxyArgv []string
	// GoroutineArgv runs "anvilproxy serve --event-loop=false" (the
	// AnvilGoroutine target), never profiled; the same flags are appended.
	// Empty skips it.
	GoroutineArgv []string
	// BaseArgv runs "serve" of another anvilproxy binary (the AnvilBase
	// target), with the same flags as ProxyArgv, never profiled. Empty
	// leaves the target out.
	BaseArgv []string
	// FloorArgv runs the floor relay (RunFloorRelay); the bench appends
	// its listen and upstream addresses. Empty skips the floor target.
	FloorArgv []string
	// HTTPFloorArgv runs the fasthttp floor (RunHTTPFloor) the same way.
	// Empty skips the floor-http target.
	HTTPFloorArgv []string
	// HeapProfile makes the capacity run send SIGUSR1 to the anvilproxy
	// child when its last wave holds every stream open: ProxyArgv then runs
	// a serve that writes a heap profile on that signal.
	HeapProfile bool
	// ProxyLogLevel is anvilproxy's --log-level. Empty means "info", the
	// serve default: one log line per request.
	ProxyLogLevel string
	// Targets limits the run to these targets (Direct is always run).
	// Empty means every target found on the machine.
	Targets []string
	// NoStreams skips the stream test (a capacity-only run).
	NoStreams bool

	// Command is the command line, recorded in the report.
	Command string
	// Progress receives one line per round; nil discards them.
	Progress io.Writer
}

// DefaultConfig is the full run: about six minutes on a 2-core machine.
//
// The gaps keep the offered load within what a 2-core machine serves
// direct with room to spare (20,000 events/s at 1,000 streams), so that
// the figures measure the proxies and not a saturated machine.
func DefaultConfig() Config {
	return Config{
		Levels: []Level{
			{Streams: 16, Events: 200, Gap: 5 * time.Millisecond},
			{Streams: 256, Events: 60, Gap: 20 * time.Millisecond},
			{Streams: 1000, Events: 20, Gap: 50 * time.Millisecond},
		},
		Rounds:         6,
		Cell:           2 * time.Second,
		EventBytes:     256,
		SmallWorkers:   64,
		SmallRounds:    6,
		SmallCell:      2 * time.Second,
		CapacityEvents: 20,
		CapacityGap:    time.Second,
		CapacityRamp:   10 * time.Second,
		ProxyLogLevel:  "info",
	}
}

// QuickConfig is a smoke run, well under a minute on a 2-core machine: 16 and
// 256 streams, 2 rounds, a short throughput test.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Levels = []Level{
		{Streams: 16, Events: 60, Gap: 5 * time.Millisecond},
		{Streams: 256, Events: 30, Gap: 20 * time.Millisecond},
	}
	c.Rounds = 2
	c.Cell = 600 * time.Millisecond
	c.SmallRounds = 2
	c.SmallCell = 500 * time.Millisecond
	return c
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if len(c.Levels) == 0 {
		c.Levels = d.Levels
	}
	setDefault(&c.Rounds, d.Rounds)
	setDefault(&c.Cell, d.Cell)
	setDefault(&c.EventBytes, d.EventBytes)
	c.EventBytes = max(c.EventBytes, MinEventBytes)
	setDefault(&c.SmallWorkers, d.SmallWorkers)
	if c.SmallRounds == 0 {
		c.SmallRounds = d.SmallRounds
	}
	setDefault(&c.SmallCell, d.SmallCell)
	setDefault(&c.CapacityEvents, d.CapacityEvents)
	setDefault(&c.CapacityGap, d.CapacityGap)
	setDefault(&c.CapacityRamp, d.CapacityRamp)
	if c.ProxyLogLevel == "" {
		c.ProxyLogLevel = d.ProxyLogLevel
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

func (c *Config) validate() error {
	for _, l := range c.Levels {
		if l.Streams <= 0 || l.Events <= 0 || l.Gap <= 0 {
			return fmt.Errorf("bench: level %+v: streams, events and gap must be positive", l)
		}
	}
	for _, t := range c.Targets {
		if !slices.Contains(allTargets, t) {
			return fmt.Errorf("bench: unknown target %q (known: %v)", t, allTargets)
		}
	}
	if len(c.BaseArgv) == 0 {
		if slices.Contains(c.Targets, AnvilBase) {
			return fmt.Errorf("bench: target %s needs a base binary to run (--base-binary)", AnvilBase)
		}
		return nil
	}
	if err := CheckBinary(c.BaseArgv[0]); err != nil {
		return fmt.Errorf("bench: base binary: %w", err)
	}
	return nil
}

// CheckBinary fails for a path that is not an executable file: a base
// binary is checked before any round runs, not when its target starts.
func CheckBinary(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

// allTargets are the targets in the order every round visits them:
// AnvilBase next to AnvilProxy, so that the two builds of an A/B run
// under the same conditions.
var allTargets = []string{Direct, AnvilProxy, AnvilBase, AnvilGoroutine, Floor, HTTPFloor, Nginx, Caddy, HAProxy}

// anvilTargets are the targets that run this build: serve's default (the
// event loop, on Linux) and the goroutine relay.
var anvilTargets = []string{AnvilProxy, AnvilGoroutine}

// Run runs the bench and returns its report. It stops every process it
// started before it returns, also when ctx is cancelled.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rep := newReport(&cfg)
	b := &runner{cfg: &cfg, rep: rep, ctx: ctx}
	defer b.close()

	need := 2*maxStreams(&cfg) + 1024
	for _, n := range cfg.Capacity {
		need = max(need, 3*n+1024)
	}
	lim, err := raiseNoFile(uint64(need))
	if err != nil && len(cfg.Capacity) == 0 {
		rep.note("open-file limit %d: %v", lim, err)
	}
	b.noFile = lim
	if b.dir, err = os.MkdirTemp("", "anvilbench-"); err != nil {
		return nil, err
	}
	if b.em, err = NewEmitter(cfg.EventBytes); err != nil {
		return nil, err
	}
	if !cfg.NoStreams {
		b.startTargets()
		for _, lv := range cfg.Levels {
			if err := b.streamLevel(lv); err != nil {
				return rep, err
			}
		}
	}
	if cfg.SmallRounds > 0 && !cfg.NoStreams {
		if err := b.smallTest(); err != nil {
			return rep, err
		}
	}
	b.noteCuts()
	b.stopTargets()
	for _, n := range cfg.Capacity {
		if err := b.capacity(n); err != nil {
			return rep, err
		}
	}
	rep.finish()
	return rep, nil
}

func maxStreams(c *Config) int {
	n := c.SmallWorkers
	for _, l := range c.Levels {
		n = max(n, l.Streams)
	}
	return n
}

// runner holds one run's emitter, targets and report.
type runner struct {
	cfg     *Config
	rep     *Report
	ctx     context.Context
	dir     string
	noFile  uint64 // the open-file limit in force
	em      *Emitter
	targets []*target
}

func (b *runner) progress(format string, args ...any) {
	fmt.Fprintf(b.cfg.Progress, format+"\n", args...)
}

// wanted reports whether the run includes target name: every target
// unless Targets lists some, but AnvilBase only with its binary.
func (b *runner) wanted(name string) bool {
	if name == AnvilBase && len(b.cfg.BaseArgv) == 0 {
		return false
	}
	return name == Direct || len(b.cfg.Targets) == 0 || slices.Contains(b.cfg.Targets, name)
}

// ownArgv returns the command of a target the bench runs from a binary
// it is given (anvilproxy's, the floors), and whether name is one; the
// other proxies are looked up on PATH.
func (b *runner) ownArgv(name string) ([]string, bool) {
	switch name {
	case AnvilProxy:
		return b.cfg.ProxyArgv, true
	case AnvilBase:
		return b.cfg.BaseArgv, true
	case AnvilGoroutine:
		return b.cfg.GoroutineArgv, true
	case Floor:
		return b.cfg.FloorArgv, true
	case HTTPFloor:
		return b.cfg.HTTPFloorArgv, true
	}
	return nil, false
}

// startTargets starts every wanted proxy that is installed, noting those
// that are not, or fail to start.
func (b *runner) startTargets() {
	b.targets = []*target{{name: Direct, version: "-", setup: "the clients connect to the emitter", addr: b.em.Addr(), upstream: b.em.Addr()}}
	b.rep.addTarget(b.targets[0], "")
	type starter struct {
		name  string
		start func(bin, up string) (*target, error)
	}
	starters := []starter{
		{AnvilProxy, func(_, up string) (*target, error) {
			return startAnvil(AnvilProxy, b.cfg.ProxyArgv, up, b.dir, b.cfg.ProxyLogLevel, max(2*maxStreams(b.cfg), 4096))
		}},
		{AnvilBase, func(_, up string) (*target, error) {
			return startBase(b.cfg.BaseArgv, up, b.dir, b.cfg.ProxyLogLevel, max(2*maxStreams(b.cfg), 4096))
		}},
		{AnvilGoroutine, func(_, up string) (*target, error) {
			return startAnvil(AnvilGoroutine, b.cfg.GoroutineArgv, up, b.dir, b.cfg.ProxyLogLevel, max(2*maxStreams(b.cfg), 4096))
		}},
		{Floor, func(_, up string) (*target, error) { return startFloor(Floor, b.cfg.FloorArgv, up, b.dir) }},
		{HTTPFloor, func(_, up string) (*target, error) { return startFloor(HTTPFloor, b.cfg.HTTPFloorArgv, up, b.dir) }},
		{Nginx, func(bin, up string) (*target, error) { return startNginx(bin, up, b.dir) }},
		{Caddy, func(bin, up string) (*target, error) { return startCaddy(bin, up, b.dir) }},
		{HAProxy, func(bin, up string) (*target, error) {
			return startHAProxy(bin, up, b.dir, max(2*maxStreams(b.cfg), 4096))
		}},
	}
	for _, s := range starters {
		if !b.wanted(s.name) {
			continue
		}
		bin := ""
		if argv, own := b.ownArgv(s.name); !own {
			var err error
			if bin, err = exec.LookPath(s.name); err != nil {
				b.rep.addTarget(&target{name: s.name}, "not installed (scripts/install-comparison-proxies.sh installs it)")
				b.progress("%s: not installed, skipped", s.name)
				continue
			}
		} else if len(argv) == 0 {
			b.rep.addTarget(&target{name: s.name}, "no command given to run it")
			continue
		}
		up, err := b.em.Listen() // each proxy its own emitter port
		if err != nil {
			b.rep.addTarget(&target{name: s.name}, err.Error())
			continue
		}
		t, err := s.start(bin, up)
		if err != nil {
			b.rep.addTarget(&target{name: s.name}, "failed to start: "+err.Error())
			b.progress("%s: failed to start: %v", s.name, err)
			continue
		}
		t.upstream = up
		b.targets = append(b.targets, t)
		b.rep.addTarget(t, "")
		b.progress("%s: %s on %s (pids %v)", t.name, t.version, t.addr, t.pids)
	}
}

// noteCuts notes the streams each target cut upstream, as the emitter saw
// them: a proxy that closes its upstream connection mid-stream.
func (b *runner) noteCuts() {
	time.Sleep(100 * time.Millisecond) // a cut shows at the emitter's next write
	for _, t := range b.targets {
		if n, last := b.em.Cut(t.upstream); n > 0 {
			b.rep.note("%s closed its upstream connection mid-stream in %d stream(s), warm-up rounds included (the emitter's last write error: %s)", t.name, n, last)
		}
	}
}

func (b *runner) stopTargets() {
	for _, t := range b.targets {
		t.stop()
	}
}

func (b *runner) close() {
	b.stopTargets()
	if b.em != nil {
		_ = b.em.Close()
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// checkAlive fails the run when a proxy died under load: its figures
// would be meaningless.
func (b *runner) checkAlive() error {
	if err := b.ctx.Err(); err != nil {
		return err
	}
	for _, t := range b.targets {
		if !t.alive() {
			msg := fmt.Sprintf("%s exited during the run (%v)", t.name, t.cmd.ProcessState)
			if tail := t.logTail(); tail != "" {
				msg += "; its output ends: " + tail
			}
			return errors.New(msg)
		}
	}
	return nil
}

// machineFacts describes the machine the run is on.
func machineFacts() Machine {
	return Machine{
		CPUs:     runtime.NumCPU(),
		CPUModel: cpuModel(),
		Kernel:   kernel(),
		Go:       runtime.Version(),
		Load1:    Num(loadAvg()),
	}
}
