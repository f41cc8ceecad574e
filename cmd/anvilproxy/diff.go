package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/anvilproxy/anvilproxy/histo/snapshot"
)

// diffUsage is what "anvilproxy diff --help" prints before the flags.
const diffUsage = "Usage: anvilproxy diff [--fail-on EXPR]... [--json] BASELINE CURRENT\n\n" +
	"The regression gate: compares two sets of anvil-serving.benchmark/v1 snapshots, each side one\n" +
	"file or directory, or several joined with commas (merged as report merges them), phase by\n" +
	"phase at p50/p90/p99, marks changes inside the noise or on too few samples, and says which\n" +
	"phase moved and what the shape suggests. --fail-on 'ttft.p99>+25%' (repeatable) exits 1\n" +
	"when the change holds and the samples suffice.\n\n"

// errGate is a --fail-on bound that held: exit 1, the reason printed.
var errGate = errors.New("regression")

// runDiff is "anvilproxy diff".
func runDiff(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("diff", diffUsage, stderr)
	var failOn listFlag
	fs.Var(&failOn, "fail-on", "METRIC.STAT OP CHANGE on the change from baseline to current, e.g. ttft.p99>+25% or e2e.p50>+200ms or cache_hit.p50<-10%; repeatable; exit 1 when one holds on enough samples")
	jsonOut := fs.Bool("json", false, "print the comparison and the bounds as JSON instead of the table")
	var sides []string
	for {
		if err := parseOnce(fs, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		sides, args = append(sides, fs.Arg(0)), fs.Args()[1:]
	}
	if len(sides) != 2 {
		fmt.Fprintf(stderr, "anvilproxy diff: want BASELINE and CURRENT (each a file, a directory, or several joined with commas), got %d arguments\n%s", len(sides), seeHelp("diff"))
		return errUsage
	}
	bounds := make([]snapshot.Bound, 0, len(failOn))
	for _, e := range failOn {
		b, err := snapshot.ParseBound(e)
		if err != nil {
			fmt.Fprintf(stderr, "anvilproxy diff: %v\n", err)
			return errUsage
		}
		bounds = append(bounds, b)
	}
	base, err := readSide(sides[0])
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	cur, err := readSide(sides[1])
	if err != nil {
		return fmt.Errorf("current: %w", err)
	}
	d, err := snapshot.Compare(base, cur)
	if err != nil {
		return err
	}
	results := make([]snapshot.BoundResult, len(bounds))
	failed := 0
	for i, b := range bounds {
		results[i] = d.Check(b)
		if results[i].Fails {
			failed++
		}
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			*snapshot.Diff
			FailOn []snapshot.BoundResult `json:"fail_on"`
			Failed bool                   `json:"failed"`
		}{d, results, failed > 0}); err != nil {
			return err
		}
	} else {
		if err := snapshot.WriteDiff(stdout, d); err != nil {
			return err
		}
		for _, r := range results {
			fmt.Fprintf(stdout, "fail-on %s: %s (change %s)\n", r.Expr, r.Why, boundChange(r))
		}
	}
	if failed > 0 {
		fmt.Fprintf(stderr, "anvilproxy diff: %d of %d --fail-on bounds held\n", failed, len(bounds))
		return errGate
	}
	return nil
}

// boundChange is the change a bound compared, in its terms.
func boundChange(r snapshot.BoundResult) string {
	switch {
	case !r.Change.Known():
		return "-"
	case r.Relative:
		return fmt.Sprintf("%+.1f%%", 100*float64(r.Change))
	}
	switch u := r.Unit(); u {
	case "ratio":
		return fmt.Sprintf("%+.1fpp", 100*float64(r.Change))
	case "x":
		return fmt.Sprintf("%+.3fx", float64(r.Change))
	default:
		return fmt.Sprintf("%+.4g %s", float64(r.Change), u)
	}
}

// readSide reads and merges one side: files and directories, joined with
// commas.
func readSide(arg string) (*snapshot.Document, error) {
	files, err := expandDirs(strings.Split(arg, ","))
	if err != nil {
		return nil, err
	}
	docs := make([]*snapshot.Document, len(files))
	for i, name := range files {
		if docs[i], err = snapshot.Read(name); err != nil {
			return nil, err
		}
	}
	return snapshot.Merge(docs...)
}
