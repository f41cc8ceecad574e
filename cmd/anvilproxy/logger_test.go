package main

import (
	"bytes"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// syncCounter is a log file that counts its Syncs (fsyncs, for a file).
type syncCounter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	syncs int
}

func (s *syncCounter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncCounter) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncs++
	return nil
}

func (s *syncCounter) read() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String(), s.syncs
}

// TestBufferedLoggerNeverFsyncs: serve's buffered log lines reach the
// writer within logFlushInterval, at Sync and at stop, and the writer's
// own Sync (an fsync for a file) is never called.
func TestBufferedLoggerNeverFsyncs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &syncCounter{}
		log, stop, err := newBufferedLogger(w, "info")
		require.NoError(t, err)
		log.Info("first")
		got, _ := w.read()
		require.Empty(t, got, "buffered")
		time.Sleep(logFlushInterval)
		synctest.Wait()
		got, _ = w.read()
		require.Contains(t, got, `"msg":"first"`, "flushed within the interval")
		log.Info("second")
		require.NoError(t, log.Sync())
		got, _ = w.read()
		require.Contains(t, got, `"msg":"second"`, "Sync flushes")
		log.Info("third")
		stop()
		got, syncs := w.read()
		require.Contains(t, got, `"msg":"third"`, "stop flushes")
		require.Zero(t, syncs, "the log file is never fsynced")
	})
}
