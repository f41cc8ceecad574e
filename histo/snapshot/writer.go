package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo"
)

// Defaults of Config.
const (
	DefaultInterval = time.Minute
	DefaultKeep     = 1440    // a day of one-minute windows
	DefaultMaxBytes = 1 << 30 // 1 GiB
)

// Config configures a Writer. The zero value ends a window every minute and
// writes nothing.
type Config struct {
	// Dir is where snapshot files go; "" ends windows without writing them.
	// One proxy per directory: a Writer removes the temporary files it finds
	// there at start.
	Dir string
	// Interval is the length of a measurement window. 0 means
	// DefaultInterval.
	Interval time.Duration
	// Keep is the most snapshot files kept in Dir; the oldest go first.
	// 0 means DefaultKeep.
	Keep int
	// MaxBytes bounds the snapshot files' total size; the oldest go first,
	// but the newest file is always kept. 0 means DefaultMaxBytes.
	MaxBytes int64
}

func (c *Config) setDefaults() error {
	if c.Interval < 0 || c.Keep < 0 || c.MaxBytes < 0 {
		return errors.New("snapshot: Interval, Keep and MaxBytes must not be negative")
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Keep == 0 {
		c.Keep = DefaultKeep
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	return nil
}

// queued is a finished window waiting to be written.
type queued struct {
	w  *histo.Window
	pm PrefillModel
}

// queueLen bounds the windows waiting for a slow disk: beyond it a window
// is dropped and counted, so that a hung disk costs bounded memory and
// never delays rotation or traffic.
const queueLen = 2

// Writer ends a measurement window of its Source every Interval and writes
// the window's v1 document to Dir from its own goroutine: the proxy's path
// never waits for it, and a full, read-only or hung disk costs a counted,
// logged error (anvilproxy_snapshot_errors_total), never traffic. Each file
// is written atomically (a temporary file in Dir, fsync, rename, fsync of
// Dir) and named by the window's start, so names sort by time. Windows
// without requests write nothing.
type Writer struct {
	cfg     Config
	src     Source
	log     *zap.Logger
	errs    prometheus.Counter
	written prometheus.Counter

	queue    chan queued
	stop     chan struct{}
	rotated  chan struct{} // closed when the rotating goroutine has ended
	finished chan struct{} // closed when the writing goroutine has ended
	once     sync.Once

	// write writes b to f; a test replaces it to fail like a full disk.
	write func(f *os.File, b []byte) error

	// last is the newest ended window, for /snapshot?window=last (last.go).
	last atomic.Pointer[queued]

	// Owned by the writing goroutine.
	lastLog    time.Time
	suppressed int
}

// NewWriter returns a Writer for src that registers its metrics on reg
// (nil: a private registry). It creates Dir and removes temporary files a
// crashed predecessor left there. Call Start to begin and Close to end.
func NewWriter(cfg Config, src Source, reg *prometheus.Registry, log *zap.Logger) (*Writer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	w := &Writer{
		cfg: cfg, src: src, log: log,
		errs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_snapshot_errors_total",
			Help: "Snapshot windows not written (full, read-only or slow disk) and failed removals of old snapshots.",
		}),
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_snapshots_written_total",
			Help: "Snapshot files written.",
		}),
		queue:    make(chan queued, queueLen),
		stop:     make(chan struct{}),
		rotated:  make(chan struct{}),
		finished: make(chan struct{}),
		write: func(f *os.File, b []byte) error {
			_, err := f.Write(b)
			return err
		},
	}
	for _, c := range []prometheus.Collector{w.errs, w.written} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("snapshot: registering metrics: %w", err)
		}
	}
	if cfg.Dir != "" {
		if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		if err := removeTemps(cfg.Dir); err != nil {
			return nil, fmt.Errorf("snapshot: removing stale temporary files: %w", err)
		}
	}
	return w, nil
}

// Start starts rotating windows and writing them.
func (w *Writer) Start() {
	go w.rotate()
	go w.drain()
}

// Close ends the current window, writes it (the final snapshot of a
// graceful shutdown: call Close after the proxy has drained) and stops. It
// gives up waiting for a hung disk when ctx ends. Close is idempotent.
func (w *Writer) Close(ctx context.Context) error {
	var err error
	w.once.Do(func() {
		close(w.stop)
		<-w.rotated
		w.enqueue(ctx, w.keep(w.src.Rotate()))
		close(w.queue)
		select {
		case <-w.finished:
		case <-ctx.Done():
			err = fmt.Errorf("snapshot: final snapshot not written: %w", ctx.Err())
		}
	})
	return err
}

// rotate ends a window every Interval.
func (w *Writer) rotate() {
	defer close(w.rotated)
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			w.offer(w.keep(w.src.Rotate()))
		case <-w.stop:
			return
		}
	}
}

// offer hands win to the writing goroutine without waiting: a window that
// finds the queue full is dropped and counted.
func (w *Writer) offer(win *histo.Window) {
	if !w.wanted(win) {
		return
	}
	select {
	case w.queue <- queued{win, prefillModel(w.src)}:
	default:
		w.errs.Inc()
		w.log.Warn("snapshot writer behind: window dropped", zap.Time("window_start", win.Start))
	}
}

// enqueue hands win to the writing goroutine, waiting until ctx ends.
func (w *Writer) enqueue(ctx context.Context, win *histo.Window) {
	if !w.wanted(win) {
		return
	}
	select {
	case w.queue <- queued{win, prefillModel(w.src)}:
	case <-ctx.Done():
	}
}

// wanted reports whether win is written: there is a directory, and the
// window saw requests.
func (w *Writer) wanted(win *histo.Window) bool {
	return w.cfg.Dir != "" && win.Goodput.Requests > 0
}

// drain writes the queued windows until Close.
func (w *Writer) drain() {
	defer close(w.finished)
	for q := range w.queue {
		path, err := w.writeWindow(q)
		if err != nil {
			w.fail("snapshot not written", err)
			continue
		}
		w.written.Inc()
		if ce := w.log.Check(zap.DebugLevel, "snapshot written"); ce != nil {
			ce.Write(zap.String("path", path))
		}
		if err := w.prune(); err != nil {
			w.fail("removing old snapshots", err)
		}
	}
}

// fail counts err and logs it at most once per Interval: a full disk fails
// every window, and one line per window would fill what is left of it.
func (w *Writer) fail(msg string, err error) {
	w.errs.Inc()
	now := time.Now()
	if !w.lastLog.IsZero() && now.Sub(w.lastLog) < w.cfg.Interval {
		w.suppressed++
		return
	}
	w.log.Error(msg, zap.String("dir", w.cfg.Dir), zap.Error(err), zap.Int("suppressed", w.suppressed))
	w.lastLog, w.suppressed = now, 0
}

func (w *Writer) writeWindow(q queued) (string, error) {
	doc, err := Build(q.w, q.pm)
	if err != nil {
		return "", err
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encoding snapshot: %w", err)
	}
	path := w.freeName(doc.RunID)
	return path, w.writeAtomic(path, append(data, '\n'))
}

// freeName is the path of a new file for run id; a second window starting
// in the same millisecond gets a suffix.
func (w *Writer) freeName(id string) string {
	path := filepath.Join(w.cfg.Dir, id+".json")
	for i := 1; ; i++ {
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			return path
		}
		path = filepath.Join(w.cfg.Dir, fmt.Sprintf("%s-%d.json", id, i))
	}
}

// Temporary files are hidden and end in .tmp, so that no reader of Dir
// takes a half-written one for a snapshot.
const tempPattern = ".anvilproxy-*.json.tmp"

// writeAtomic writes data to path so that path is either absent or whole,
// even across a crash: temporary file, fsync, rename, fsync of the
// directory (the rename is durable only once the directory is).
func (w *Writer) writeAtomic(path string, data []byte) (err error) {
	f, err := os.CreateTemp(w.cfg.Dir, tempPattern)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	// CreateTemp makes the file 0600; a snapshot holds no content or
	// secret, and dashboards run as other users.
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = w.write(f, data); err != nil {
		return fmt.Errorf("writing %s: %w", f.Name(), err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", f.Name(), err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", f.Name(), err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	return syncDir(w.cfg.Dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

// removeTemps removes the temporary files of writes a crash interrupted.
func removeTemps(dir string) error {
	names, err := filepath.Glob(filepath.Join(dir, tempPattern))
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		errs = append(errs, os.Remove(name))
	}
	return errors.Join(errs...)
}

// prune removes the oldest snapshots beyond Keep files or MaxBytes in
// total, always keeping the newest.
func (w *Writer) prune() error {
	entries, err := os.ReadDir(w.cfg.Dir)
	if err != nil {
		return err
	}
	type file struct {
		name string
		size int64
	}
	var files []file
	var total int64
	for _, e := range entries {
		if !e.Type().IsRegular() || !IsSnapshotName(e.Name()) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		files = append(files, file{e.Name(), info.Size()})
		total += info.Size()
	}
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.name, b.name) })
	var errs []error
	for len(files) > 1 && (len(files) > w.cfg.Keep || total > w.cfg.MaxBytes) {
		if err := os.Remove(filepath.Join(w.cfg.Dir, files[0].name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		total -= files[0].size
		files = files[1:]
	}
	return errors.Join(errs...)
}

// IsSnapshotName reports whether name is the name of a snapshot file the
// Writer writes, anvilproxy-20261129T230500.123Z.json: time-sortable,
// named by the window's start, UTC.
func IsSnapshotName(name string) bool {
	const layout = "20060102T150405.000Z"
	rest, ok := strings.CutPrefix(name, "anvilproxy-")
	if !ok || !strings.HasSuffix(rest, ".json") || len(rest) < len(layout) {
		return false
	}
	_, err := time.Parse(layout, rest[:len(layout)])
	return err == nil
}
