package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/anvilproxy/anvilproxy/histo/snapshot"
)

// reportUsage is what "anvilproxy report --help" prints before the flags.
const reportUsage = "Usage: anvilproxy report [--json FILE|-] FILE|DIR...\n\n" +
	"Merges anvil-serving.benchmark/v1 snapshots exactly and prints where the time goes: the\n" +
	"phases, then (for the proxy's files) the agent's time against the engine's, what the\n" +
	"prompts are made of, the queue knee and whether the host measured cleanly. A directory\n" +
	"stands for the snapshot files in it (anvilproxy-*.json).\n\n"

// runReport reads v1 snapshots (the proxy's or the benchmark client's),
// merges them exactly and prints the phase table and the lines after it
// (snapshot.WriteTable); --json writes the merged document. Flags may come
// before, between or after the files; a directory stands for the snapshot
// files in it (anvilproxy-*.json, as --snapshot-dir writes them).
func runReport(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("report", reportUsage, stderr)
	jsonOut := fs.String("json", "", `also write the merged v1 document to FILE ("-": to stdout, instead of the table)`)
	var files []string
	for {
		if err := parseOnce(fs, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		files, args = append(files, fs.Arg(0)), fs.Args()[1:]
	}
	if len(files) == 0 {
		fmt.Fprintf(stderr, "anvilproxy report: no snapshot files given\n%s", seeHelp("report"))
		return errUsage
	}
	files, err := expandDirs(files)
	if err != nil {
		return err
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

// expandDirs replaces each directory among names by the snapshot files in
// it, oldest first. A directory without any is an error: "report DIR" on
// the wrong directory should say so, not print an empty report.
func expandDirs(names []string) ([]string, error) {
	var out []string
	for _, name := range names {
		fi, err := os.Stat(name)
		if err != nil || !fi.IsDir() {
			out = append(out, name) // snapshot.Read reports a missing file
			continue
		}
		files, err := snapshotFiles(name)
		if err != nil {
			return nil, err
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: a directory with no snapshot files (anvilproxy-*.json)", name)
		}
		out = append(out, files...)
	}
	return out, nil
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
