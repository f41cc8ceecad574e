package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// topUsage is what "anvilproxy top --help" prints before the flags.
const topUsage = "Usage: anvilproxy top [--once] [--count N] [ADMIN-URL]\n\n" +
	"A live table of a running proxy, read from its admin listener's /status (default " + defaultTopURL + "):\n" +
	"requests and how they ended since start, in-flight, p50/p99 of the phases, the rate and\n" +
	"the cache hit (engine-reported, and inferred from prefill times) over the last 15 s,\n" +
	"goodput and retry amplification since start. Ctrl-C ends it.\n\n"

// runTop is "anvilproxy top": the demo's live table for a running proxy,
// read from its admin listener's /status, for a machine reached over SSH
// where no browser is at hand. On a terminal it redraws in place every
// second until Ctrl-C; elsewhere it appends one line every few seconds.
// --once prints one table and exits, non-zero when the proxy did not
// answer.
func runTop(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("top", topUsage, stderr)
	once := fs.Bool("once", false, "print one table and exit (non-zero when the proxy does not answer)")
	count := fs.Int("count", 0, "print this many tables, then exit; 0: until Ctrl-C")
	plain := fs.Bool("plain", false, "one line per refresh, even on a terminal")
	every := fs.Duration("interval", 0, "time between refreshes (default 1s on a terminal, 5s elsewhere)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long each fetch of /status may take")
	token := fs.String("admin-token", os.Getenv("ANVIL_ADMIN_TOKEN"), "the proxy's --admin-token, if it has one (default $ANVIL_ADMIN_TOKEN)")
	if err := parseOnce(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		fmt.Fprintf(stderr, "anvilproxy top: one admin URL at most, got %q\n%s", fs.Args(), seeHelp("top"))
		return errUsage
	}
	base := defaultTopURL
	if fs.NArg() == 1 {
		base = fs.Arg(0)
	}
	base, err := adminBase(base)
	if err != nil {
		return err
	}
	n := *count
	if *once {
		n = 1
	}
	client := &http.Client{Timeout: *timeout}
	get := func() (liveStatus, error) { return fetchStatus(client, base, *token) }
	if n == 1 { // one table: an unreachable proxy is an error, not a line
		s, err := get()
		if err != nil {
			return err
		}
		for _, l := range topRender(s, true) {
			fmt.Fprintln(stdout, l)
		}
		return nil
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tty := isTerminal(stdout) && !*plain
	if tty {
		fmt.Fprintf(stdout, "anvilproxy top  %s  (Ctrl-C ends it)\n", base)
	}
	refresh(ctx, stdout, tty, *every, n, get, topRender)
	return nil
}

// defaultTopURL is serve's default admin listener, seen from the host.
const defaultTopURL = "http://127.0.0.1:9464"

// adminBase accepts host:port or a URL, and returns the URL without a
// trailing slash or /status.
func adminBase(raw string) (string, error) {
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	raw = strings.TrimSuffix(strings.TrimSuffix(raw, "/"), "/status")
	if _, err := checkUpstream(raw); err != nil {
		return "", fmt.Errorf("admin URL %q: want http://host:port of the proxy's --admin-listen", raw)
	}
	return raw, nil
}

// fetchStatus reads one liveStatus from base/status.
func fetchStatus(client *http.Client, base, token string) (liveStatus, error) {
	var s liveStatus
	req, err := http.NewRequest("GET", base+"/status", nil)
	if err != nil {
		return s, err
	}
	if token != "" {
		req.Header.Set("Authorization", bearer(token))
	}
	resp, err := client.Do(req)
	if err != nil {
		return s, fmt.Errorf("no answer from %s/status: %v (is anvilproxy serving there? --admin-listen sets the address)", base, unwrapURL(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		return s, fmt.Errorf("%s/status: HTTP 401: the proxy has an --admin-token; pass it with --admin-token or ANVIL_ADMIN_TOKEN", base)
	}
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("%s/status: HTTP %d (an anvilproxy admin listener without /status is older than top)", base, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&s); err != nil {
		return s, fmt.Errorf("%s/status: %w", base, err)
	}
	return s, nil
}

func unwrapURL(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}

// topRender is top's table: the demo's, with the proxy's uptime for a
// clock, then a line on the upstream's readiness.
func topRender(s liveStatus, block bool) []string {
	c := "up " + clock(time.Duration(s.UptimeSec*float64(time.Second)))
	up := "upstream  ready: " + s.Upstream.Reason
	if !s.Upstream.Ready {
		up = "upstream  NOT READY: " + s.Upstream.Reason
	}
	up += "  (" + s.Upstream.Upstream + ")"
	if !block {
		l := s.line(c)
		if !s.Upstream.Ready {
			l += " | UPSTREAM NOT READY"
		}
		return []string{l}
	}
	return append(s.block(c), "  "+up)
}
