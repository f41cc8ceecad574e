package conformance

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// disconnectLimit is how soon after the client leaves the engine must stop
// working for it.
const disconnectLimit = 100 * time.Millisecond

// TestClientDisconnectReachesEngine: a client that leaves while ollama is
// still in prefill (a long fresh prompt takes seconds on the tiny model)
// makes the proxy close the upstream connection at once; ollama's [GIN]
// log line gives its handler's duration, so the engine stopped at
// send + duration, which must be within 100 ms of the client leaving.
func TestClientDisconnectReachesEngine(t *testing.T) {
	st := newStack(t)
	logPath := os.Getenv("ANVIL_REAL_ENGINE_LOG")
	if logPath == "" {
		t.Skip("SKIP: ANVIL_REAL_ENGINE_LOG (ollama's log file) is not set; scripts/real-engine.sh env prints it")
	}
	before := fileSize(t, logPath)
	const leaveAfter = 500 * time.Millisecond
	body := `{"model":"` + plainModel + `","stream":true,"messages":[{"role":"user","content":"` + freshPrompt(3000) + `"}]}`
	r := do(t, st.proxyURL, "/v1/chat/completions", body, "", leaveAfter)
	left := r.cancelledAt()
	if left.IsZero() || r.status != 0 {
		t.Fatalf("the client did not leave before the answer (status %d): the prompt was too short", r.status)
	}
	took := ginDuration(t, logPath, before, "/v1/chat/completions")
	late := r.sent.Add(took).Sub(left)
	t.Logf("client left %.1f ms after sending; ollama's handler ran %.1f ms: it stopped %.1f ms after the client left", ms(left.Sub(r.sent)), ms(took), ms(late))
	if late < -5*time.Millisecond {
		t.Fatalf("ollama finished %.1f ms before the client left: the test did not catch it working", -ms(late))
	}
	if late > disconnectLimit {
		t.Errorf("ollama stopped %.1f ms after the client left, want < %v", ms(late), disconnectLimit)
	}
	rec := st.waitRecords(t, 1)[0]
	if !rec.Failed || rec.ErrSide != "client" {
		t.Errorf("record: failed %v, error side %q kind %q; want a client-side failure", rec.Failed, rec.ErrSide, rec.ErrKind)
	}
}

// freshPrompt is n characters of words no earlier request sent, so the
// engine's prompt cache cannot shorten its prefill: it starts with the
// clock.
func freshPrompt(n int) string {
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, seed>>1))
	words := strings.Fields("alpha beta gamma delta omega sigma kappa theta zeta lambda")
	var b strings.Builder
	fmt.Fprintf(&b, "%d", seed)
	for b.Len() < n {
		fmt.Fprintf(&b, " %s%d", words[r.IntN(len(words))], r.IntN(1000))
	}
	return b.String()[:n]
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// ginLine matches gin's access log line:
// [GIN] 2026/12/01 - 08:27:57 | 200 |   74.594647ms |       127.0.0.1 | POST     "/v1/chat/completions"
var ginLine = regexp.MustCompile(`^\[GIN\] [^|]+\|\s*\d+\s*\|\s*(\S+)\s*\|[^|]+\|\s*POST\s+"([^"]+)"`)

// ginDuration waits for the first [GIN] line for path written after offset
// and returns its handler duration.
func ginDuration(t *testing.T, path string, offset int64, route string) time.Duration {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(offset, 0); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			m := ginLine.FindStringSubmatch(sc.Text())
			if m == nil || m[2] != route {
				continue
			}
			f.Close()
			d, err := time.ParseDuration(m[1])
			if err != nil {
				t.Fatalf("gin duration %q: %v", m[1], err)
			}
			return d
		}
		f.Close()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no [GIN] line for %s in %s within 30 s", route, path)
	return 0
}
