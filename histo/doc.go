// Package histo turns the proxy's Traces into phase measurements: exact HDR
// histograms per window for v1 snapshots, native+classic Prometheus
// histograms for /metrics, an honest queue/prefill split, and goodput
// against configured SLOs.
//
// # Where things are
//
// One concern a file (or a few); each file's opening comment says more.
//
//   - The Recorder: Config, New, Record, the proxy.Recorder hooks
//     (ObserveGap, ObserveRelay), Register and Handler for /metrics and
//     /requests (recorder.go); FirstOutput, proxy.FirstOutputObserver's
//     hook, in live.go.
//   - The phase table, the one place each phase's names, unit, Prometheus
//     metric and JSON keys are declared, and evalPhases, each phase's
//     definition over the Trace and the split, evaluated once per Record
//     (phases.go). Metric, Unit and the HDR histograms they size, with the
//     HDR+Prometheus pair each phase is recorded into (hdr.go); the
//     Prometheus collectors and their labels (metrics.go, labeled.go).
//   - The per-request record: Request and its nullable values Span, Float
//     and Count, the /requests ring, and ServeJSON, the one JSON answer of
//     /requests, /snapshot and /status (requests.go); records beyond
//     inference and conversation ids (requests_other.go); the failure words
//     (failures.go).
//   - Windows: Rotate, Current and the cumulative window, with their
//     request records shared in chunks, not copied (Records; window.go), and
//     the shape every per-window tally of one concern shares (tally.go).
//     The concerns, each a tally, a section of the Window and of the v1
//     extension, and its Merge function: client retries (retry.go), prompt
//     prefix drift and reuse (prefix.go), the prompt ledger (ledger.go), the
//     concurrency knee (knee.go), conversations and agent time
//     (conversations.go), prefix-cache figures (cache.go), the engine's own
//     figures and /metrics (engine.go), goodput against SLOs (goodput.go).
//   - The queue/prefill split (docs/queue-split.md): its sources (split.go),
//     the engine timeline it reads (occupancy.go), the learned slot count
//     (slots.go), the prefill cost model (rate.go), the per-slot prompt
//     cache of ollama and llama.cpp, replayed (slotcache.go), the batch lock
//     (lock.go), when the engine sends its head (head.go), the engine's
//     scraped load as evidence (engineload.go), and the first outputs of
//     requests still in flight (live.go).
//
// Beside it: histo/dist holds the nullable number and the mergeable
// distribution histo and its sections share; histo/selfcheck is the
// host-noise probe the Recorder owns; histo/engine scrapes the engine's
// /metrics (an EngineLoad); histo/snapshot writes, merges, reports and
// diffs the v1 files; histo/dashboard is the admin page.
//
// # Who uses what
//
// The exported surface is what these use, and the types their fields and
// results expose (the sections' record types, Phase, Unit, Stamps), plus
// every constant of an exported enum (Metric, Unit, QueueSource, the
// readings), since its values reach the consumers:
//
//   - cmd/anvilproxy wires a Recorder (Config, New, Register, SelfCheck,
//     SetEngineLoad), reads it live (Recent, Goodput, EngineTotals,
//     WindowStart), parses --slo (ParseSLO, SLONames) and draws the live
//     table from the phase table (Metric.Phase, Metric.Value,
//     Phase.ShortName) and the failure words (FailureClass).
//   - histo/snapshot turns a Window into a v1 document: the phase table
//     (NumMetrics, Metric.Phase, MetricByName, Metric.Float, NewHistogram),
//     Request, the sections and their Merge functions, QueueSources, and
//     ServeJSON.
//   - histo/engine, histo/selfcheck and histo/dashboard import nothing of
//     histo; histo imports the first two.
//   - Tests outside the package (histo_test, proxy/conformance, cmd and
//     snapshot tests) drive a Recorder through Record, Rotate, Current,
//     Slots and PrefillRate, and read Request's Span values.
//
// Concurrency: a Recorder is safe for concurrent use; what it returns
// (Windows, Requests, sections) belongs to the caller.
package histo
