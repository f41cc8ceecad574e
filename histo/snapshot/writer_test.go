package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/anvilproxy/anvilproxy/histo"
)

func newWriter(t *testing.T, cfg Config, src Source) (*Writer, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	w, err := NewWriter(cfg, src, prometheus.NewRegistry(), zap.New(core))
	require.NoError(t, err)
	return w, logs
}

func snapshotFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestWriterFinalSnapshot: Close writes the window in progress, atomically,
// under a time-sortable name, after removing a crashed predecessor's
// temporary file; a window without requests writes nothing.
func TestWriterFinalSnapshot(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, ".anvilproxy-123.json.tmp")
	require.NoError(t, os.WriteFile(stale, []byte(`{"sch`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o644))

	r, clk := newRecorder(t, histo.Config{})
	w, _ := newWriter(t, Config{Dir: dir, Interval: time.Hour}, r)
	require.NoFileExists(t, stale)
	w.Start()
	record(r, 0, 5, 0)
	clk.t = t0.Add(30 * time.Second)
	require.NoError(t, w.Close(context.Background()))
	require.NoError(t, w.Close(context.Background()), "idempotent")

	require.Equal(t, []string{"anvilproxy-20261129T230500.123Z.json", "notes.txt"}, snapshotFiles(t, dir))
	info, err := os.Stat(filepath.Join(dir, "anvilproxy-20261129T230500.123Z.json"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), info.Mode().Perm())
	doc, err := Read(filepath.Join(dir, "anvilproxy-20261129T230500.123Z.json"))
	require.NoError(t, err)
	require.Equal(t, int64(5), doc.Requests)
	require.Equal(t, 30_000.0, float64(doc.WallClockMs))
	require.Equal(t, 1.0, testutil.ToFloat64(w.written))
	require.Zero(t, testutil.ToFloat64(w.errs))

	// Nothing recorded: nothing written.
	empty, _ := newWriter(t, Config{Dir: dir, Interval: time.Hour}, r)
	empty.Start()
	require.NoError(t, empty.Close(context.Background()))
	require.Len(t, snapshotFiles(t, dir), 2)
}

// TestWriterRotatesEveryInterval: the ticker ends a window every
// Interval, not before, with or without a directory. In a bubble the
// interval is exact.
func TestWriterRotatesEveryInterval(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		synctest.Test(t, func(t *testing.T) {
			r, _ := newRecorder(t, histo.Config{})
			w, _ := newWriter(t, Config{Dir: dir, Interval: 5 * time.Millisecond}, r)
			record(r, 0, 3, 0)
			w.Start()
			t.Cleanup(func() { _ = w.Close(context.Background()) }) // a failure must not leave the bubble blocked
			time.Sleep(5*time.Millisecond - time.Nanosecond)
			synctest.Wait()
			require.Equal(t, 3, r.Current().Requests.Len(), "dir %q: not before the interval", dir)
			time.Sleep(time.Nanosecond)
			synctest.Wait() // the window is rotated and written
			require.Zero(t, r.Current().Requests.Len(), "dir %q: rotated at the interval", dir)
			record(r, 3, 5, 0)
			time.Sleep(5 * time.Millisecond)
			synctest.Wait()
			require.Zero(t, r.Current().Requests.Len(), "dir %q: and at the next", dir)
			require.NoError(t, w.Close(context.Background()))
			if dir != "" {
				require.Len(t, snapshotFiles(t, dir), 2, "one file per window with requests")
			}
			require.Equal(t, 0.0, testutil.ToFloat64(w.errs))
		})
	}
}

func TestWriterRetention(t *testing.T) {
	dir := t.TempDir()
	names := []string{
		"anvilproxy-20261129T230000.000Z.json", "anvilproxy-20261129T230100.000Z.json",
		"anvilproxy-20261129T230200.000Z.json", "anvilproxy-20261129T230300.000Z.json",
		"anvilproxy-20261129T230400.000Z.json",
	}
	for _, n := range names {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), make([]byte, 100), 0o644))
	}
	other := []string{"anvilproxy-merged-20261129T230000.000Z.json", "notes.txt"}
	for _, n := range other {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), make([]byte, 1000), 0o644))
	}
	r, _ := newRecorder(t, histo.Config{})

	w, _ := newWriter(t, Config{Dir: dir, Keep: 3}, r)
	require.NoError(t, w.prune())
	require.Equal(t, append(names[2:], other...), snapshotFiles(t, dir), "by count, oldest first; other files untouched")

	w, _ = newWriter(t, Config{Dir: dir, MaxBytes: 150}, r)
	require.NoError(t, w.prune())
	require.Equal(t, append(names[4:], other...), snapshotFiles(t, dir), "by bytes")

	w, _ = newWriter(t, Config{Dir: dir, MaxBytes: 1}, r)
	require.NoError(t, w.prune())
	require.Equal(t, append(names[4:], other...), snapshotFiles(t, dir), "the newest is always kept")
}

// TestWriterDiskFull: every write fails as on a full disk. The errors are
// counted, logged once per interval, no partial file is left, and traffic
// is recorded and windows rotate as if nothing happened. In a bubble the
// windows end on time: 5 intervals, 5 failed windows.
func TestWriterDiskFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		r, _ := newRecorder(t, histo.Config{})
		w, logs := newWriter(t, Config{Dir: dir, Interval: 2 * time.Millisecond}, r)
		w.write = func(f *os.File, b []byte) error {
			_, _ = f.Write(b[:len(b)/2])
			return &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
		}
		w.Start()
		t.Cleanup(func() { _ = w.Close(context.Background()) })
		time.Sleep(50 * time.Microsecond) // no request at the instant of a rotation
		for i := range 105 {              // traffic for 10.5 ms
			record(r, i, i+1, 0)
			time.Sleep(100 * time.Microsecond)
		}
		synctest.Wait()
		require.Equal(t, 5.0, testutil.ToFloat64(w.errs))
		require.Equal(t, 5, r.Current().Requests.Len(), "the window in progress: 0.5 ms of traffic")
		require.NoError(t, w.Close(context.Background()))
		require.Equal(t, 6.0, testutil.ToFloat64(w.errs), "and the final window")

		require.Empty(t, snapshotFiles(t, dir), "no snapshot and no temporary file")
		require.Zero(t, testutil.ToFloat64(w.written))
		failed := logs.FilterMessage("snapshot not written").All()
		require.NotEmpty(t, failed)
		require.ErrorIs(t, failed[0].Context[1].Interface.(error), syscall.ENOSPC)
	})
}

func TestWriterLogsOncePerInterval(t *testing.T) {
	r, _ := newRecorder(t, histo.Config{})
	w, logs := newWriter(t, Config{Interval: time.Hour}, r)
	for range 5 {
		w.fail("snapshot not written", syscall.EROFS)
	}
	require.Equal(t, 5.0, testutil.ToFloat64(w.errs))
	require.Equal(t, 1, logs.Len())
}

// TestWriterHungDisk: with the writer stuck on a disk that does not
// answer, rotation never waits: windows beyond the queue are dropped and
// counted, and Close gives up at its deadline.
func TestWriterHungDisk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _ := newRecorder(t, histo.Config{})
		w, _ := newWriter(t, Config{Dir: t.TempDir(), Interval: time.Hour}, r)
		release := make(chan struct{})
		w.write = func(*os.File, []byte) error { <-release; return errors.New("too late") }
		w.Start()
		t.Cleanup(func() { // a failure must not leave the bubble blocked
			select {
			case <-release:
			default:
				close(release)
			}
		})
		for i := range 6 {
			record(r, i, i+1, 0)
			w.offer(r.Rotate()) // never blocks
			synctest.Wait()     // the first is taken up by the writer, which hangs
		}
		require.Equal(t, 3.0, testutil.ToFloat64(w.errs), "6 windows, 1 being written, 2 queued")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, w.Close(ctx), context.DeadlineExceeded)
		close(release)
		<-w.finished // before the directory is removed
	})
}

func TestIsSnapshotName(t *testing.T) {
	for name, want := range map[string]bool{
		"anvilproxy-20261129T230500.123Z.json":   true,
		"anvilproxy-20261129T230500.123Z-1.json": true,
		"anvilproxy-merged-20261129T230500.json": false,
		".anvilproxy-123.json.tmp":               false,
		"anvilproxy-20261129T230500.123Z.txt":    false,
	} {
		require.Equal(t, want, IsSnapshotName(name), name)
	}
}

func TestNewWriterRejectsNegative(t *testing.T) {
	r, _ := newRecorder(t, histo.Config{})
	_, err := NewWriter(Config{Keep: -1}, r, nil, zap.NewNop())
	require.Error(t, err)
}
