package bench

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Target names, in the order every round visits them.
const (
	Direct = "direct"
	// AnvilProxy is anvilproxy serve as it runs by default: on Linux its
	// streams are relayed by the event loops (proxy.DefaultEventLoop,
	// docs/design.md "The event-loop relay").
	AnvilProxy = "anvilproxy"
	// AnvilGoroutine is anvilproxy serve --event-loop=false: the same
	// build relaying each stream on its connection's goroutine, in the
	// same rounds.
	AnvilGoroutine = "anvilproxy-goroutine"
	// AnvilBase is another anvilproxy binary (Config.BaseArgv, e.g. one
	// built from an earlier commit) run as AnvilProxy runs this build, in
	// the same rounds: an A/B of a change within one run. Only run when
	// given.
	AnvilBase = "anvilproxy-base"
	Floor     = "floor"
	// HTTPFloor is a fasthttp reverse proxy that measures nothing
	// (RunHTTPFloor): the floor of the non-stream path on fasthttp.
	HTTPFloor = "floor-http"
	Nginx     = "nginx"
	Caddy     = "caddy"
	HAProxy   = "haproxy"
)

// target is one way from the clients to the emitter: straight, or through
// a proxy process the bench started. A proxy's CPU and memory are read from
// its own processes, apart from the bench's.
type target struct {
	name     string
	version  string
	setup    string // how it was configured, one line
	addr     string // where the clients connect
	upstream string // the emitter address it forwards to
	metrics  string // the proxy's /metrics URL, for anvilproxy
	cmd      *exec.Cmd
	exited   chan struct{}
	pids     []int // the processes whose CPU is the target's
	logPath  string
}

// proxied reports whether the target is a proxy process.
func (t *target) proxied() bool { return t.cmd != nil }

// cpu returns the CPU time used so far by the target's processes.
func (t *target) cpu() (time.Duration, error) { return sumPids(t.pids, cpuTime) }

// rss returns the resident memory of the target's processes.
func (t *target) rss() (int64, error) { return sumPids(t.pids, rssBytes) }

// sumPids is the sum of read over pids, or read's first error.
func sumPids[T time.Duration | int64](pids []int, read func(pid int) (T, error)) (T, error) {
	var sum T
	for _, pid := range pids {
		v, err := read(pid)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// stop ends the proxy process: SIGTERM, then SIGKILL after a grace.
func (t *target) stop() {
	if t.cmd == nil || t.cmd.Process == nil {
		return
	}
	select {
	case <-t.exited:
		return
	default:
	}
	_ = t.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-t.exited:
	case <-time.After(5 * time.Second):
		_ = t.cmd.Process.Kill()
		<-t.exited
	}
}

// alive reports whether the proxy process is still running.
func (t *target) alive() bool {
	if t.cmd == nil {
		return true
	}
	select {
	case <-t.exited:
		return false
	default:
		return true
	}
}

// logTail returns the end of the process's output, for error messages.
func (t *target) logTail() string {
	b, err := os.ReadFile(t.logPath)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return strings.TrimSpace(string(b))
}

// freeAddr returns a loopback address with a port free at the time of
// the call, for a proxy to listen on.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// launch starts cmd with its output in logName under dir, and waits until
// a request through addr reaches the emitter.
func launch(name string, cmd *exec.Cmd, addr, dir string) (*target, error) {
	t := &target{name: name, addr: addr, cmd: cmd, exited: make(chan struct{}), logPath: filepath.Join(dir, name+".log")}
	out, err := os.Create(t.logPath)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		_ = cmd.Wait()
		close(t.exited)
	}()
	if err := t.waitReady(15 * time.Second); err != nil {
		t.stop()
		if tail := t.logTail(); tail != "" {
			err = fmt.Errorf("%w; its output ends: %s", err, tail)
		}
		return nil, err
	}
	t.pids = append([]int{cmd.Process.Pid}, childPIDs(cmd.Process.Pid)...)
	return t, nil
}

// waitReady waits until one small request through the target succeeds.
func (t *target) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var body []byte
	for {
		if !t.alive() {
			return fmt.Errorf("%s exited at start (%v)", t.name, t.cmd.ProcessState)
		}
		cc, err := dialClient(t.addr, clientBufSize)
		if err == nil {
			body = appendSmallRequest(body[:0], 0, 0)
			_, err = runSmall(cc, t.addr, body)
			cc.Close()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering on %s after %v: %w", t.name, t.addr, limit, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// startAnvil runs "anvilproxy serve" as a child process named name
// (AnvilProxy or AnvilGoroutine): argv runs serve, and the flags it needs are
// appended.
func startAnvil(name string, argv []string, upstream, dir, logLevel string, maxConns int) (*target, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command to run anvilproxy serve")
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := append(argv[1:len(argv):len(argv)],
		"--upstream", "http://"+upstream, "--listen", addr, "--admin-listen", admin,
		"--log-level", logLevel, "--max-upstream-conns", strconv.Itoa(maxConns), "--shutdown-grace", "2s")
	cmd := exec.Command(argv[0], args...)
	cmd.Dir = dir
	t, err := launch(name, cmd, addr, dir)
	if err != nil {
		return nil, err
	}
	t.version = "this build"
	t.metrics = "http://" + admin + "/metrics"
	t.setup = fmt.Sprintf("anvilproxy serve, real recorder, --log-level %s (one line per request to a file), --max-upstream-conns %d, /metrics read between levels", logLevel, maxConns)
	if extra := serveFlags(argv); len(extra) > 0 {
		t.setup += "; also " + strings.Join(extra, " ")
	}
	return t, nil
}

// startBase runs the AnvilBase target: argv's binary as startAnvil runs
// this build, named by the commit it was built from when its build info
// says.
func startBase(argv []string, upstream, dir, logLevel string, maxConns int) (*target, error) {
	t, err := startAnvil(AnvilBase, argv, upstream, dir, logLevel, maxConns)
	if err != nil {
		return nil, err
	}
	t.version = binaryVersion(argv[0])
	t.setup = "the base binary " + argv[0] + ", as anvilproxy: " + t.setup
	return t, nil
}

// binaryVersion names the Go binary at path by the commit its build info
// records (vcs.revision, "+dirty" when the tree was modified), else by
// its file name.
func binaryVersion(path string) string {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return filepath.Base(path)
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "+dirty"
		}
	}
	if rev == "" {
		return filepath.Base(path) + " (" + info.GoVersion + ")"
	}
	return rev + dirty
}

// serveFlags returns the flags argv passes to serve beyond the command
// itself ("anvilproxy serve", or the profiled serve and its two paths).
func serveFlags(argv []string) []string {
	for i, a := range argv {
		if a == "serve" {
			return argv[i+1:]
		}
		if a == "--as-profiled-serve" && len(argv) >= i+3 {
			return argv[i+3:]
		}
	}
	return nil
}

// startFloor runs a floor (RunFloorRelay, or RunHTTPFloor for HTTPFloor)
// as a child process named name: argv runs it, and the listen and
// upstream addresses are appended.
func startFloor(name string, argv []string, upstream, dir string) (*target, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command to run the " + name + " target")
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], append(argv[1:len(argv):len(argv)], addr, upstream)...)
	cmd.Dir = dir
	t, err := launch(name, cmd, addr, dir)
	if err != nil {
		return nil, err
	}
	t.version = "this build"
	if name == HTTPFloor {
		t.setup = "a fasthttp reverse proxy that measures nothing: fasthttp.Server and a HostClient, the response streamed (proxy/bench/floorhttp.go)"
		return t, nil
	}
	t.setup = fmt.Sprintf("a TCP relay in Go that measures nothing: %d edge-triggered epoll loops on raw descriptors, one upstream connection per client connection (proxy/bench/floor_linux.go)", runtime.NumCPU())
	return t, nil
}

const nginxConf = `worker_processes %d;
daemon off;
pid %[2]s/nginx.pid;
error_log %[2]s/nginx-error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 16384; }
http {
	access_log %[2]s/nginx-access.log;
	client_body_temp_path %[2]s/nginx-body;
	proxy_temp_path %[2]s/nginx-proxy;
	keepalive_requests 1000000;
	keepalive_timeout 120s;
	upstream emitter {
		server %[3]s;
		keepalive 2048;
		keepalive_requests 1000000;
		keepalive_timeout 120s;
	}
	server {
		listen %[4]s backlog=4096;
		location / {
			proxy_pass http://emitter;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
			proxy_read_timeout 300s;
		}
	}
}
`

func startNginx(bin, upstream, dir string) (*target, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, runtime.NumCPU(), dir, upstream, addr), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-p", dir+"/", "-c", conf, "-e", filepath.Join(dir, "nginx-error.log"))
	t, err := launch(Nginx, cmd, addr, dir)
	if err != nil {
		return nil, err
	}
	t.version = versionOf(bin, "-v")
	t.setup = fmt.Sprintf("%d workers, proxy_buffering off, proxy_http_version 1.1, upstream keepalive 2048, access log to a file", runtime.NumCPU())
	return t, nil
}

const caddyfile = `{
	admin off
	auto_https off
	storage file_system %[1]s/caddy-data
}
http://:%[3]s {
	bind 127.0.0.1
	reverse_proxy %[2]s {
		flush_interval -1
		transport http {
			keepalive 2m
			keepalive_idle_conns 4096
			keepalive_idle_conns_per_host 4096
		}
	}
}
`

func startCaddy(bin, upstream, dir string) (*target, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, fmt.Appendf(nil, caddyfile, dir, upstream, port), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", conf, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	t, err := launch(Caddy, cmd, addr, dir)
	if err != nil {
		return nil, err
	}
	t.version = versionOf(bin, "version")
	t.setup = "reverse_proxy with flush_interval -1, keepalive_idle_conns_per_host 4096, no access log (its default)"
	return t, nil
}

const haproxyConf = `global
	maxconn %d
	nbthread %d
defaults
	mode http
	timeout connect 5s
	timeout client 5m
	timeout server 5m
	timeout http-keep-alive 2m
	option http-no-delay
frontend bench
	bind %s
	default_backend emitter
backend emitter
	server emitter %s
`

// startHAProxy runs HAProxy for up to maxConns client connections (it
// needs two descriptors per connection and refuses to start without them).
func startHAProxy(bin, upstream, dir string, maxConns int) (*target, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(conf, fmt.Appendf(nil, haproxyConf, maxConns, runtime.NumCPU(), addr, upstream), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-db", "-f", conf)
	t, err := launch(HAProxy, cmd, addr, dir)
	if err != nil {
		return nil, err
	}
	t.version = versionOf(bin, "-v")
	t.setup = fmt.Sprintf("%d threads, option http-no-delay, default http-reuse, no log (its default)", runtime.NumCPU())
	return t, nil
}

// versionOf returns the first line a binary prints for its version flag.
func versionOf(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil && len(out) == 0 {
		return "unknown"
	}
	line, _, _ := bytes.Cut(bytes.TrimSpace(out), []byte("\n"))
	return string(line)
}
