package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBaseTargetWanted: the anvilproxy-base target runs only with its
// binary, among all targets or when listed; listed without one, or with a
// binary that is not there, the run fails before it starts anything.
func TestBaseTargetWanted(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "anvilproxy-old")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755))
	for _, tc := range []struct {
		name    string
		cfg     Config
		wanted  bool
		invalid string
	}{
		{"no binary, every target", Config{}, false, ""},
		{"binary, every target", Config{BaseArgv: []string{bin, "serve"}}, true, ""},
		{"binary, not listed", Config{BaseArgv: []string{bin, "serve"}, Targets: []string{AnvilProxy}}, false, ""},
		{"binary, listed", Config{BaseArgv: []string{bin, "serve"}, Targets: []string{AnvilProxy, AnvilBase}}, true, ""},
		{"listed without binary", Config{Targets: []string{AnvilBase}}, false, "needs a base binary"},
		{"missing binary", Config{BaseArgv: []string{bin + ".gone", "serve"}}, true, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.validate()
			if tc.invalid != "" {
				require.ErrorContains(t, err, tc.invalid)
				return
			}
			require.NoError(t, err)
			b := &runner{cfg: &tc.cfg}
			require.Equal(t, tc.wanted, b.wanted(AnvilBase))
			require.True(t, b.wanted(AnvilProxy) || len(tc.cfg.Targets) > 0)
		})
	}
	_, err := Run(t.Context(), Config{BaseArgv: []string{bin + ".gone", "serve"}})
	require.ErrorContains(t, err, "base binary")
}

// TestBinaryVersion: a Go binary is named by its build info, anything
// else by its file name.
func TestBinaryVersion(t *testing.T) {
	exe, err := os.Executable() // this test binary: build info without vcs stamps
	require.NoError(t, err)
	require.Contains(t, binaryVersion(exe), filepath.Base(exe))
	require.Equal(t, "sh-script", binaryVersion(writeFile(t, "sh-script", "#!/bin/sh\n")))
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o755))
	return p
}
