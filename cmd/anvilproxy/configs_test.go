package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/anvilproxy/anvilproxy/histo/snapshot"
)

const configsDir = "../../configs"

// family is one metric family of a /metrics scrape.
type family struct {
	typ, help string
	labels    []string // label names of its samples, without le
	native    bool     // a histogram with native buckets
}

// scrapeFamilies runs serve's stack, sends one good stream and one the
// engine cuts mid-stream (so that error counters have a child), and
// returns the anvilproxy_* families of a text /metrics scrape.
func scrapeFamilies(t *testing.T) map[string]*family {
	t.Helper()
	st := startTestStack(t, snapshot.Config{Interval: time.Hour})
	st.chat(t)
	req, err := http.NewRequest(http.MethodPost, st.proxyURL+"/v1/chat/completions", strings.NewReader(
		`{"model":"m","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"`+strings.Repeat("cut ", 40)+`"}]}`))
	require.NoError(t, err)
	req.Header.Set("X-Sim-Fail-After-Events", "1")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	require.Eventually(t, func() bool { return st.counter(t, "anvilproxy_client_attempts_total") >= 2 }, 10*time.Second, 10*time.Millisecond)

	resp, err := http.Get(st.adminURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	fams, err := parseExposition(resp.Body)
	require.NoError(t, err)
	require.NotEmpty(t, fams)
	// The text format does not show native buckets; the registry does.
	mfs, err := st.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if f := fams[mf.GetName()]; f != nil && len(mf.GetMetric()) > 0 {
			h := mf.GetMetric()[0].GetHistogram()
			f.native = h != nil && h.Schema != nil
		}
	}
	return fams
}

// parseExposition reads the Prometheus text format: HELP and TYPE lines
// name the families; sample lines give their labels.
func parseExposition(r io.Reader) (map[string]*family, error) {
	fams := make(map[string]*family)
	get := func(name string) *family {
		if fams[name] == nil {
			fams[name] = &family{}
		}
		return fams[name]
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sample := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, help, _ := strings.Cut(rest, " ")
			get(name).help = help
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			get(name).typ = typ
			continue
		}
		m := sample.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		f := fams[familyOf(fams, m[1])]
		if f == nil {
			return nil, fmt.Errorf("sample %q before its TYPE line", m[1])
		}
		for _, l := range label.FindAllStringSubmatch(m[2], -1) {
			if l[1] != "le" && !slices.Contains(f.labels, l[1]) {
				f.labels = append(f.labels, l[1])
			}
		}
	}
	for name := range fams {
		if !strings.HasPrefix(name, "anvilproxy_") {
			delete(fams, name)
		}
	}
	return fams, sc.Err()
}

// familyOf maps a sample or query name to its family: a histogram's
// _bucket, _sum and _count series belong to the histogram (a summary's
// _sum and _count to the summary).
func familyOf(fams map[string]*family, name string) string {
	if _, ok := fams[name]; ok {
		return name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f, ok := fams[base]; ok && (f.typ == "histogram" || f.typ == "summary") {
				return base
			}
		}
	}
	return name
}

var metricName = regexp.MustCompile(`anvilproxy_[a-zA-Z0-9_]+`)

// TestConfigsNameRealMetrics: every metric that a Grafana query, a
// dashboard variable or a recording rule names is one the proxy exports.
func TestConfigsNameRealMetrics(t *testing.T) {
	fams := scrapeFamilies(t)
	queries := map[string][]string{
		"grafana/anvilproxy-dashboard.json": grafanaQueries(t, filepath.Join(configsDir, "grafana/anvilproxy-dashboard.json")),
		"prometheus/anvilproxy.rules.yml":   ruleQueries(t, filepath.Join(configsDir, "prometheus/anvilproxy.rules.yml")),
		"prometheus/anvilproxy.alerts.yml":  ruleQueries(t, filepath.Join(configsDir, "prometheus/anvilproxy.alerts.yml")),
	}
	// A recorded series an alert or a rule reads is recorded by one of them.
	recorded := map[string]bool{}
	for _, f := range []string{"anvilproxy.rules.yml", "anvilproxy.alerts.yml"} {
		for _, r := range ruleRecords(t, filepath.Join(configsDir, "prometheus", f)) {
			recorded[r] = true
		}
	}
	for _, f := range []string{"anvilproxy.rules.yml", "anvilproxy.alerts.yml"} {
		for _, expr := range ruleQueries(t, filepath.Join(configsDir, "prometheus", f)) {
			for _, name := range recordedName.FindAllString(expr, -1) {
				require.True(t, recorded[name], "%s: %q reads %s, which no rule records", f, expr, name)
			}
		}
	}
	for file, exprs := range queries {
		require.NotEmpty(t, exprs, file)
		named := 0
		for _, expr := range exprs {
			for _, name := range metricName.FindAllString(expr, -1) {
				named++
				_, ok := fams[familyOf(fams, name)]
				require.True(t, ok, "%s: %q names %s, which /metrics does not export", file, expr, name)
			}
		}
		require.Positive(t, named, file)
	}
}

// grafanaQueries returns every query string of a Grafana dashboard: panel
// targets' expr and template variables' query and definition.
func grafanaQueries(t *testing.T, path string) []string {
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc any
	require.NoError(t, json.Unmarshal(raw, &doc))
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "query" || k == "definition") {
					out = append(out, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	return out
}

var recordedName = regexp.MustCompile(`anvilproxy:[a-zA-Z0-9_:]+`)

// ruleRecords returns the names a rule file records.
func ruleRecords(t *testing.T, path string) []string {
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var rules struct {
		Groups []struct{ Rules []struct{ Record string } }
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	var out []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out = append(out, r.Record)
			}
		}
	}
	return out
}

func ruleQueries(t *testing.T, path string) []string {
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Record, Alert, Expr string
			}
		}
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	var out []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Expr, "rule %s%s", r.Record, r.Alert)
			require.True(t, strings.HasPrefix(r.Record, "anvilproxy:") || r.Alert != "", "recorded names are level:metric:operation (%s)", r.Record)
			out = append(out, r.Expr)
		}
	}
	return out
}

// TestPromtool checks the Prometheus files with promtool when it is
// installed (Debian: apt-get install prometheus), and runs the alerting
// rules' unit tests (configs/prometheus/anvilproxy.alerts.test.yml).
func TestPromtool(t *testing.T) {
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (apt-get install prometheus): Prometheus configs not checked by promtool")
	}
	for _, args := range [][]string{
		{"check", "config", filepath.Join(configsDir, "prometheus/prometheus.yml")},
		{"check", "rules", filepath.Join(configsDir, "prometheus/anvilproxy.rules.yml")},
		{"check", "rules", filepath.Join(configsDir, "prometheus/anvilproxy.alerts.yml")},
		// The alerts' unit tests: each fires on its shape, not on its neighbour's.
		{"test", "rules", filepath.Join(configsDir, "prometheus/anvilproxy.alerts.test.yml")},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// TestREADMEMetricTable: the README's metric reference lists exactly the
// metrics /metrics exports. go test -run TestREADMEMetricTable -update
// rewrites it from the scrape.
func TestREADMEMetricTable(t *testing.T) {
	fams := scrapeFamilies(t)
	const path, begin, end = "../../README.md", "<!-- metrics:begin -->\n", "<!-- metrics:end -->"
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	readme := string(raw)
	i, j := strings.Index(readme, begin), strings.Index(readme, end)
	require.True(t, i >= 0 && j > i, "README.md has no %q … %q block", begin, end)
	if *update {
		readme = readme[:i+len(begin)] + metricTable(fams) + readme[j:]
		require.NoError(t, os.WriteFile(path, []byte(readme), 0o644))
		j = strings.Index(readme, end)
	}
	var listed []string
	for _, line := range strings.Split(readme[i:j], "\n") {
		if name, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ = strings.Cut(name, "`")
			listed = append(listed, name)
		}
	}
	var exported []string
	for name := range fams {
		exported = append(exported, name)
	}
	slices.Sort(listed)
	slices.Sort(exported)
	require.Equal(t, exported, listed, "README.md's metric table and /metrics differ: go test ./cmd/anvilproxy -run TestREADMEMetricTable -update")
}

// metricTable renders the families as the README's table.
func metricTable(fams map[string]*family) string {
	names := make([]string, 0, len(fams))
	for name := range fams {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("| metric | type | labels | meaning |\n|---|---|---|---|\n")
	for _, name := range names {
		f := fams[name]
		labels := "—"
		if len(f.labels) > 0 {
			labels = "`" + strings.Join(f.labels, "`, `") + "`"
		}
		typ := f.typ
		if f.native {
			typ = "histogram (native + classic)"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, typ, labels, strings.ReplaceAll(f.help, "|", `\|`))
	}
	return b.String()
}

// TestExampleConfig: configs/anvilproxy.example.conf names every flag of
// serve, commented out or not, and the lines it sets load.
func TestExampleConfig(t *testing.T) {
	path := filepath.Join(configsDir, "anvilproxy.example.conf")
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var f serveFlags
	f.register(fs)
	mentioned := make(map[string]bool)
	for _, line := range strings.Split(string(raw), "\n") {
		name, _, ok := strings.Cut(strings.TrimLeft(line, "# "), "=")
		if ok && !strings.Contains(name, " ") {
			mentioned[name] = true
		}
	}
	fs.VisitAll(func(fl *flag.Flag) {
		if fl.Name != "config" {
			require.True(t, mentioned[fl.Name], "%s does not mention --%s", path, fl.Name)
		}
	})
	require.NoError(t, loadConfig(fs, path))
	require.Equal(t, "http://127.0.0.1:8000", f.upstream)
	require.Equal(t, "ttft=2s,tpot=50ms", f.slos.String())
}

// TestKubernetesManifests: every document parses and has a kind and a
// name; the ConfigMap's config file loads with serve's flags.
func TestKubernetesManifests(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(configsDir, "kubernetes", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	kinds := map[string]bool{}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		dec := yaml.NewDecoder(strings.NewReader(string(raw)))
		for {
			var doc struct {
				APIVersion string `yaml:"apiVersion"`
				Kind       string `yaml:"kind"`
				Metadata   struct{ Name string }
				Data       map[string]string `yaml:"data"`
			}
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else {
				require.NoError(t, err, file)
			}
			require.NotEmpty(t, doc.APIVersion, file)
			require.NotEmpty(t, doc.Kind, file)
			kinds[doc.Kind] = true
			if doc.Kind == "Kustomization" {
				continue
			}
			require.Equal(t, "anvilproxy", doc.Metadata.Name, file)
			if conf, ok := doc.Data["anvilproxy.conf"]; ok {
				p := filepath.Join(t.TempDir(), "anvilproxy.conf")
				require.NoError(t, os.WriteFile(p, []byte(conf), 0o644))
				fs := flag.NewFlagSet("serve", flag.ContinueOnError)
				var f serveFlags
				f.register(fs)
				require.NoError(t, loadConfig(fs, p), "%s: anvilproxy.conf", file)
			}
		}
	}
	for _, k := range []string{"Deployment", "Service", "ServiceMonitor", "PodMonitor", "ConfigMap"} {
		require.True(t, kinds[k], "no %s manifest", k)
	}
}
