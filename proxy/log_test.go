package proxy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestLogTracePhases: the request line carries the phases of phase.go
// under their words, and leaves out a phase that did not happen.
func TestLogTracePhases(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	p := &Proxy{log: zap.New(core)}
	recv := time.Unix(1000, 0)
	tr := Trace{Recv: recv, FirstOutput: recv.Add(30 * time.Millisecond), End: recv.Add(90 * time.Millisecond)}
	p.logTrace(&tr)
	require.Equal(t, 1, logs.Len())
	f := logs.All()[0].ContextMap()
	require.Equal(t, 30*time.Millisecond, f[NameTTFO])
	require.Equal(t, 90*time.Millisecond, f[NameE2E])
	require.NotContains(t, f, NameTTFT, "no content: no ttft")
	require.Equal(t, "ttfo", NameTTFO)
}
