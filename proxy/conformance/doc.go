// Package conformance holds the real-engine conformance suite: anvilproxy,
// started in-process through the proxy and histo packages exactly as
// `anvilproxy serve` wires them, in front of a real ollama serving the tiny
// generated model of scripts/tinygguf. An independent client (net/http, its
// own SSE splitter and classifier) stamps every event on arrival; the
// suite holds the proxy's per-request records (/requests) to those stamps,
// and the proxied bytes to the direct ones.
//
// The tests skip unless ANVIL_REAL_ENGINE is the engine's base URL;
// scripts/real-engine.sh test builds and starts the engine and runs them.
// docs/real-engine.md says what each test proves. The package has no
// non-test code.
package conformance
