// The log lines: one info line per request (logTrace), and fasthttp's own
// lines kept to their format string.

package proxy

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// serverLog takes fasthttp's own log lines. Their arguments can hold the
// raw bytes of a bad request, headers and API keys included, so only the
// format string is kept, at debug level.
type serverLog struct{ log *zap.Logger }

func (l serverLog) Printf(format string, _ ...any) {
	l.log.Debug("fasthttp", zap.String("event", format))
}

// logTrace writes the one info line of a request. It carries stamps, counts
// and labels only: never a prompt, a completion or a header value.
func (p *Proxy) logTrace(tr *Trace) {
	ce := p.log.Check(zapcore.InfoLevel, "request")
	if ce == nil {
		return
	}
	ce.Write(
		zap.Uint64("id", tr.ID),
		zap.String("route", tr.Route.String()),
		zap.String("model", tr.Model),
		zap.Int("status", tr.Status),
		zap.Bool("stream", tr.Stream),
		phaseField(NameTTFO, tr.TTFO),
		phaseField(NameTTFT, tr.TTFT),
		phaseField(NameE2E, tr.E2E),
		zap.Int("events", tr.Events),
		zap.Int64("prompt_tokens", tr.PromptTokens),
		zap.Int64("completion_tokens", tr.CompletionTokens),
		zap.Int64("cached_tokens", tr.CachedTokens),
		zap.Bool("cold", tr.Cold),
		zap.Stringer("error_side", tr.ErrSide),
		zap.Stringer("error", tr.ErrKind),
		zap.Bool("truncated", tr.Truncated),
	)
}

// phaseField logs a phase of proxy/phase.go, or nothing when it did not
// happen.
func phaseField(key string, phase func() (time.Duration, bool)) zap.Field {
	d, ok := phase()
	if !ok {
		return zap.Skip()
	}
	return zap.Duration(key, d)
}
