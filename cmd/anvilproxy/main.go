// Command anvilproxy is a transparent measuring reverse proxy for LLM
// inference servers. Subcommands: serve (the default), sim, demo, report and
// bench.
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

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const usage = `anvilproxy — a transparent measuring reverse proxy for LLM inference servers.

Usage:
  anvilproxy [serve] [flags]   run the proxy (the default subcommand)
  anvilproxy sim [flags]       run the simulated inference server
  anvilproxy demo [flags]      sim + proxy + simulated coding agents, with a live table and dashboard
  anvilproxy report FILE...    merge v1 snapshots and print where the time goes
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
	case "bench":
		err = runBench(args, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "anvilproxy: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(stderr, "anvilproxy %s: %v\n", cmd, err)
	return 1
}

// errUsage reports bad flags; the flag package has already printed why.
var errUsage = errors.New("usage")

// parseFlags parses args into fs, mapping errors to errUsage or flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %q\n", fs.Args())
		return errUsage
	}
	return nil
}

// newLogger returns a JSON logger on w at the given level.
func newLogger(w io.Writer, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), lvl)
	return zap.New(core), nil
}
