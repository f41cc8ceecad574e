package prefix_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy/prefix"
	"github.com/anvilproxy/anvilproxy/sse"
)

func Example() {
	tr, err := prefix.New(prefix.Config{})
	if err != nil {
		panic(err)
	}
	body := func(stamp, history string) []byte {
		return []byte(`{"model":"m","stream":true,"messages":[` +
			`{"role":"system","content":"You are a coding agent. Time: ` + stamp + `"},` +
			`{"role":"user","content":"Fix the flaky test in pkg/cache, it fails one run in ten."}` + history + `]}`)
	}
	turn := `,{"role":"assistant","content":"Running the tests."},{"role":"tool","content":"ok  pkg/cache 0.01s"}`
	now := time.Now()

	// After each response: observe the request, then compare with the
	// engine's usage (here: 60 prompt tokens, 2 cached).
	tr.Observe(sse.ProtocolChat, body("2025-06-01T10:00:00Z", ""), now)
	tr.Observe(sse.ProtocolChat, body("2025-06-01T10:00:00Z", turn), now)
	r := tr.Observe(sse.ProtocolChat, body("2025-06-01T10:05:00Z", turn+strings.Replace(turn, "0.01s", "0.02s", 1)), now)
	tr.Cache(&r, 60, 2)

	// The system prompt drifted at the changed minute, byte 45 of its text
	// (d.Offset), so only its first 45 bytes were reusable.
	d := r.Drift
	fmt.Println(r.Turn, d.Segment, d.MessageIndex, d.Role, d.Class)
	fmt.Println("miss despite reuse:", r.MissDespiteReuse)
	s := tr.Stats()
	fmt.Println(s.Tracked, s.Drifts[prefix.SegmentSystem][prefix.ClassDigits], len(tr.RecentDrifts(10)))
	// Output:
	// 2 system 0 system digits
	// miss despite reuse: false
	// 3 1 1
}
