package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

// loadConfig sets the flags of fs that the command line left unset from a
// config file of "flag=value" lines: one flag per line, an optional leading
// "-" or "--", "#" comment lines and blank lines ignored, whitespace around
// the name and the value trimmed. A repeatable flag (--slo) may appear on
// several lines. The command line wins: a flag it set, the file does not
// touch, so that "--config prod.conf --log-level debug" works as expected.
// path "" does nothing.
func loadConfig(fs *flag.FlagSet, path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	onCommandLine := make(map[string]bool)
	fs.Visit(func(fl *flag.Flag) { onCommandLine[fl.Name] = true })
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		name, value, err := configLine(sc.Text())
		if err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
		switch {
		case name == "":
			continue
		case name == "config":
			return fmt.Errorf("%s:%d: a config file cannot name another", path, n)
		case fs.Lookup(name) == nil:
			return fmt.Errorf("%s:%d: unknown flag %q", path, n, name)
		case onCommandLine[name]:
			continue
		}
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("%s:%d: --%s: %w", path, n, name, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("--config: reading %s: %w", path, err)
	}
	return nil
}

// configLine splits one line of a config file; name is "" for a blank or
// comment line.
func configLine(line string) (name, value string, err error) {
	line = strings.TrimSpace(line)
	if line == "" || strings.HasPrefix(line, "#") {
		return "", "", nil
	}
	name, value, ok := strings.Cut(line, "=")
	if !ok {
		return "", "", errors.New(`want flag=value`)
	}
	name = strings.TrimLeft(strings.TrimSpace(name), "-")
	if name == "" {
		return "", "", errors.New(`want flag=value`)
	}
	return name, strings.TrimSpace(value), nil
}
