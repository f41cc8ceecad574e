package snapshot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Read reads and checks the v1 document in the file at path. Its errors are
// one line and name the file.
func Read(path string) (*Document, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err // *PathError names the file
	}
	doc, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return doc, nil
}

// Decode parses and checks a v1 document: JSON, complete, with the v1
// schema, the keys a merge needs and, from the proxy, histograms that
// decode.
func Decode(data []byte) (*Document, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("empty file, not a v1 document")
	}
	if !json.Valid(data) {
		return nil, syntaxError(data)
	}
	var probe struct {
		Schema         *string          `json:"schema"`
		RequestTimings *json.RawMessage `json:"request_timings"`
		Metrics        *json.RawMessage `json:"metrics"`
		Started        *int64           `json:"started_at_unix_ns"`
		Finished       *int64           `json:"finished_at_unix_ns"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("not a v1 document: %w", err)
	}
	switch {
	case probe.Schema == nil:
		return nil, fmt.Errorf("not a v1 document: no \"schema\" key (want %q)", Schema)
	case *probe.Schema != Schema:
		return nil, fmt.Errorf("schema is %q, want %q", *probe.Schema, Schema)
	case probe.RequestTimings == nil || probe.Metrics == nil || probe.Started == nil || probe.Finished == nil:
		return nil, errors.New("incomplete v1 document: request_timings, metrics, started_at_unix_ns and finished_at_unix_ns are required")
	}
	var doc Document
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("malformed v1 document: %w", err)
	}
	// Merge's own reading, so that a bad histogram is reported here, with
	// the file's name, rather than by Merge.
	if _, err := docPart(&doc); err != nil {
		return nil, fmt.Errorf("malformed anvilproxy object: %w", err)
	}
	return &doc, nil
}

// syntaxError says why data is not JSON, telling a truncated file (a write
// cut short) from one that is not JSON at all.
func syntaxError(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var v any
	err := dec.Decode(&v)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("truncated JSON: the file ends after %d bytes, inside the document", len(data))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("not JSON: %v at byte %d", se, se.Offset)
	}
	if err == nil {
		return fmt.Errorf("not JSON: data after the document at byte %d", dec.InputOffset())
	}
	return fmt.Errorf("not JSON: %w", err)
}
