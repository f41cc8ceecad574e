package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoadConfig(t *testing.T) {
	write := func(t *testing.T, content string) string {
		p := filepath.Join(t.TempDir(), "anvilproxy.conf")
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		return p
	}
	parse := func(t *testing.T, content string, args ...string) (*serveFlags, error) {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f serveFlags
		f.register(fs)
		require.NoError(t, fs.Parse(append(args, "--config", write(t, content))))
		return &f, loadConfig(fs, f.config)
	}

	t.Run("sets what the command line did not", func(t *testing.T) {
		f, err := parse(t, "# a comment\n\nupstream = http://engine:8000\n--listen=:9000\nlog-level=debug\nslo=ttft=2s\nslo=tpot=50ms\ninject-usage=true\n",
			"--log-level", "warn")
		require.NoError(t, err)
		require.Equal(t, "http://engine:8000", f.upstream)
		require.Equal(t, ":9000", f.listen)
		require.Equal(t, "warn", f.logLevel, "the command line wins")
		require.Equal(t, "ttft=2s,tpot=50ms", f.slos.String(), "a repeatable flag on several lines")
		require.True(t, f.cfg.InjectUsage)
		require.Equal(t, 10*time.Minute, f.cfg.UpstreamReadTimeout, "unset flags keep their defaults")
	})
	for _, tc := range []struct{ name, content, want string }{
		{"unknown flag", "no-such-flag=1\n", `anvilproxy.conf:1: unknown flag "no-such-flag"`},
		{"bad value", "\nread-timeout=soon\n", "anvilproxy.conf:2: --read-timeout"},
		{"no value", "inject-usage\n", "anvilproxy.conf:1: want flag=value"},
		{"nested config", "config=other.conf\n", "cannot name another"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.content)
			require.ErrorContains(t, err, tc.want)
		})
	}
	t.Run("missing file", func(t *testing.T) {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		require.ErrorContains(t, loadConfig(fs, filepath.Join(t.TempDir(), "none.conf")), "--config")
	})
}
