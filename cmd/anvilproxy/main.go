// Command anvilproxy is a transparent measuring reverse proxy for LLM
// inference servers. Subcommands: serve (the default), top, sim, demo,
// report, diff and bench.
//
// Flags are parsed here and only here; the packages take plain Config structs.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const usage = `anvilproxy — a transparent measuring reverse proxy for LLM inference servers.

Usage:
  anvilproxy [serve] [flags]   run the proxy (the default subcommand)
  anvilproxy top [ADMIN-URL]   a live table of a running proxy, in the terminal (default http://127.0.0.1:9464)
  anvilproxy demo [flags]      sim + proxy + simulated coding agents, with a live table and dashboard
  anvilproxy report FILE|DIR...  merge v1 snapshots and print where the time goes
  anvilproxy diff BASE CURRENT   the regression gate: which phase moved, --fail-on 'ttft.p99>+25%'
  anvilproxy sim [flags]       run the simulated inference server
  anvilproxy bench [--quick]   measure the proxy's overhead against direct, nginx, Caddy, HAProxy
  anvilproxy help              show this help

Run "anvilproxy <command> --help" for the flags of a command.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a subcommand and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	} else if len(args) > 0 && isHelp(args[0]) {
		cmd = "help" // "anvilproxy --help": every command, then serve's flags
	}
	var err error
	switch cmd {
	case "serve":
		err = runServe(args, stderr)
	case "sim":
		err = runSim(args, stderr)
	case "demo":
		err = runDemo(args, stdout, stderr)
	case "report":
		err = runReport(args, stdout, stderr)
	case "diff":
		err = runDiff(args, stdout, stderr)
	case "bench":
		err = runBench(args, stdout, stderr)
	case "top":
		err = runTop(args, stdout, stderr)
	case "help":
		printHelp(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "anvilproxy: unknown command %q\n%s", cmd, seeHelp(""))
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.Is(err, errGate):
		return 1 // the reason is printed
	}
	fmt.Fprintf(stderr, "anvilproxy %s: %v\n", cmd, err)
	return 1
}

// printHelp writes the commands, then the flags of serve, the default.
func printHelp(w io.Writer) {
	fmt.Fprint(w, usage)
	fs := newFlagSet("serve", "", w)
	var f serveFlags
	f.register(fs)
	fmt.Fprint(w, "\nFlags of serve (the default command):\n")
	fs.PrintDefaults()
}

// newFlagSet is the flag set of subcommand name, writing its help and
// errors to out. A non-empty about is what --help prints before the flags;
// without one, --help prints a generic usage line and the flags (parseOnce).
func newFlagSet(name, about string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	if about != "" {
		fs.Usage = func() {
			fmt.Fprint(fs.Output(), about)
			fs.PrintDefaults()
		}
	}
	return fs
}

func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help":
		return true
	}
	return false
}

// seeHelp is the one line printed after a usage error, instead of every
// flag: a typo should not scroll the reason off the screen.
func seeHelp(cmd string) string {
	if cmd == "" {
		return "Run \"anvilproxy help\" for the commands.\n"
	}
	return fmt.Sprintf("Run \"anvilproxy %s --help\" for its flags.\n", cmd)
}

// errUsage reports bad flags or arguments; why has already been printed.
var errUsage = errors.New("usage")

// parseFlags parses args into fs, mapping errors to errUsage or
// flag.ErrHelp. --help prints fs.Usage (or every flag when it has none); a
// bad flag prints the flag package's one-line reason and seeHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := parseOnce(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %q\n%s", fs.Args(), seeHelp(fs.Name()))
		return errUsage
	}
	return nil
}

// parseOnce is fs.Parse with parseFlags' output: the full usage for
// --help, one line for a mistake.
func parseOnce(fs *flag.FlagSet, args []string) error {
	help := fs.Usage
	if help == nil {
		help = func() {
			fmt.Fprintf(fs.Output(), "Usage: anvilproxy %s [flags]\n\nFlags:\n", fs.Name())
			fs.PrintDefaults()
		}
	}
	fs.Usage = func() {} // the flag package calls it on errors too
	defer func() { fs.Usage = help }()
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		help()
		return err
	}
	fmt.Fprint(fs.Output(), seeHelp(fs.Name()))
	return errUsage
}

// newLogger returns a JSON logger on w at the given level.
// logFlushInterval bounds how long serve's buffered log lines wait.
const logFlushInterval = 200 * time.Millisecond

// newBufferedLogger is newLogger with lines gathered in a 256 KiB buffer
// and written at most logFlushInterval late, or when the buffer fills: one
// write(2) for many request lines instead of one each (about a tenth of the
// CPU of a short non-stream request). stop flushes and ends the flusher;
// Sync flushes too. Neither fsyncs w: zapcore.AddSync would make a file's
// Sync an fsync(2), which the flusher would then run five times a second
// (4.5% of the proxy's CPU in a 256-stream bench, and disk writes on a
// busy host). A line written is the kernel's; like nginx's access log, it
// is lost only if the machine goes down.
func newBufferedLogger(w io.Writer, level string) (log *zap.Logger, stop func(), err error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, nil, fmt.Errorf("--log-level: %w", err)
	}
	ws := &zapcore.BufferedWriteSyncer{WS: zapcore.AddSync(writeOnly{w}), Size: 256 << 10, FlushInterval: logFlushInterval}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(encoderConfig()), ws, lvl)
	return zap.New(core), func() { _ = ws.Stop() }, nil
}

// writeOnly hides any Sync method of the writer it holds.
type writeOnly struct{ io.Writer }

func encoderConfig() zapcore.EncoderConfig {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	return enc
}

func newLogger(w io.Writer, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(encoderConfig()), zapcore.AddSync(w), lvl)
	return zap.New(core), nil
}
