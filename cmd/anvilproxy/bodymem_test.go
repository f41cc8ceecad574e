package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// peakRSS returns a process's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmHWM: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/PID/status")
	return 0
}

// TestLargeBodiesMemory (L3): eight concurrent 57 MiB prompts (57 messages
// of 1 MiB, as an agent pasting files sends) peak at no more than 800 MiB
// of resident memory in the proxy: each body is held once, and the prefix
// tracker's working copies are bounded and reused. It once peaked at
// 1.56 GB; sixteen at 2.3–4.3 GB.
func TestLargeBodiesMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 900 MB through loopback")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc")
	}
	const n = 8
	var arrived atomic.Int32
	all := make(chan struct{}) // closed when the upstream holds all eight at once
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if arrived.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
		case <-time.After(time.Minute):
			t.Error("the proxy never held all eight bodies at once")
		}
		io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(up.Close)
	s := startProc(t, up.URL)
	body := bigPrompt(57)
	codes := postAtOnce(s.proxyURL, n, func() io.Reader { return bytes.NewReader(body) })
	peak := peakRSS(t, s.cmd.Process.Pid)
	t.Logf("8 × %d MiB bodies: peak RSS %d MiB", len(body)>>20, peak>>20)
	require.Equal(t, []int{200, 200, 200, 200, 200, 200, 200, 200}, codes)
	require.LessOrEqual(t, peak, int64(800<<20))
}

// TestBodyBudgetBoundsMemory (L5b): sixteen 64 MB prompts at once, inside
// the default --max-inflight-body-bytes (1 GiB), keep the proxy's peak
// resident memory within 1.25 × the budget + 150 MiB, with a declared
// Content-Length and chunked. They peaked at 1,235 MiB and 2,071 MiB: the
// chunked body grew by appends in fasthttp's pooled buffer, and the garbage
// of every growth waited for a GC paced to twice the live heap.
func TestBodyBudgetBoundsMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 2 GB through loopback")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc")
	}
	const n = 16
	body := bigPrompt(61)
	require.Less(t, len(body), int(64e6))
	const budget = 1 << 30
	for _, chunked := range []bool{false, true} {
		t.Run(map[bool]string{false: "content-length", true: "chunked"}[chunked], func(t *testing.T) {
			var arrived atomic.Int32
			all := make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost {
					return // the start probe
				}
				io.Copy(io.Discard, r.Body)
				if arrived.Add(1) == n {
					close(all)
				}
				select {
				case <-all:
				case <-time.After(time.Minute):
				}
				io.WriteString(w, `{"choices":[]}`)
			}))
			t.Cleanup(up.Close)
			s := startProc(t, up.URL)
			codes := postAtOnce(s.proxyURL, n, func() io.Reader {
				var rd io.Reader = bytes.NewReader(body)
				if chunked {
					rd = io.MultiReader(rd) // no length: sent chunked
				}
				return rd
			})
			peak := peakRSS(t, s.cmd.Process.Pid)
			t.Logf("%d × %d MB bodies: peak RSS %d MiB (bound %d MiB)", n, len(body)/1e6, peak>>20, (budget*5/4+150<<20)>>20)
			ok := 0
			for _, c := range codes {
				if c == 200 {
					ok++
				}
			}
			require.Equal(t, n, ok, "codes %v", codes)
			require.Equal(t, n, int(arrived.Load()))
			require.LessOrEqual(t, peak, int64(budget*5/4+150<<20))
		})
	}
}

// bigPrompt is a chat request of mib messages of 1 MiB each.
func bigPrompt(mib int) []byte {
	msg := `{"role":"user","content":"` + strings.Repeat("a", 1<<20) + `"},`
	return []byte(`{"model":"m","messages":[` + strings.TrimSuffix(strings.Repeat(msg, mib), ",") + `]}`)
}

// postAtOnce posts n bodies from body to the proxy's chat route at once
// and returns their statuses (0 where the request failed).
func postAtOnce(proxyURL string, n int, body func() io.Reader) []int {
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(proxyURL+"/v1/chat/completions", "application/json", body())
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	return codes
}
