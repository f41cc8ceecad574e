package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/anvilproxy/anvilproxy/histo/snapshot"
)

// runReport reads v1 snapshots (the proxy's or the benchmark client's),
// merges them exactly and prints the phase table and the lines after it
// (snapshot.WriteTable); --json writes the merged document. Flags may come
// before, between or after the files.
func runReport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: anvilproxy report [--json FILE|-] FILE...\n\n"+
			"Merges anvil-serving.benchmark/v1 snapshots exactly and prints where the time goes: the\n"+
			"phases, then (for the proxy's files) the agent's time against the engine's, what the\n"+
			"prompts are made of, the queue knee and whether the host measured cleanly.\n\n")
		fs.PrintDefaults()
	}
	jsonOut := fs.String("json", "", `also write the merged v1 document to FILE ("-": to stdout, instead of the table)`)
	var files []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return errUsage
		}
		if fs.NArg() == 0 {
			break
		}
		files, args = append(files, fs.Arg(0)), fs.Args()[1:]
	}
	if len(files) == 0 {
		fmt.Fprintln(stderr, "anvilproxy report: no snapshot files given")
		fs.Usage()
		return errUsage
	}
	docs := make([]*snapshot.Document, len(files))
	for i, name := range files {
		doc, err := snapshot.Read(name)
		if err != nil {
			return err
		}
		docs[i] = doc
	}
	merged, err := snapshot.Merge(docs...)
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, merged, stdout); err != nil {
			return err
		}
		if *jsonOut == "-" {
			return nil
		}
	}
	return snapshot.WriteTable(stdout, merged)
}

// writeJSON writes doc, indented, to path or to stdout for "-".
func writeJSON(path string, doc *snapshot.Document, stdout io.Writer) error {
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the merged document: %w", err)
	}
	data = append(data, '\n')
	if path == "-" {
		_, err = stdout.Write(data)
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
