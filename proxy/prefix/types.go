package prefix

import "time"

// SegmentKind is the kind of a prompt segment. Segments are hashed in the
// order system, tools, messages (see the package comment).
type SegmentKind uint8

// Segment kinds. NumSegmentKinds bounds them, for arrays indexed by kind.
const (
	SegmentNone    SegmentKind = iota
	SegmentSystem              // a leading system or developer message, Responses instructions, Anthropic system
	SegmentTools               // the whole tools array; its parts are the individual tools
	SegmentMessage             // one message or Responses input item
	SegmentPrompt              // a 4 KiB chunk of a completions prompt
	NumSegmentKinds
)

var segmentNames = [...]string{"none", "system", "tools", "message", "prompt"}

// String returns the kind's name, such as "system".
func (k SegmentKind) String() string { return name(segmentNames[:], int(k)) }

// MarshalText encodes the kind as its name, so that JSON snapshots read well.
func (k SegmentKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Role is the author of a message segment, from a fixed set.
type Role uint8

// Roles. Anything not listed (including a missing role) is RoleOther;
// RoleNone marks segments that are not messages (tools, prompt chunks).
const (
	RoleNone Role = iota
	RoleSystem
	RoleDeveloper
	RoleUser
	RoleAssistant
	RoleTool
	RoleOther
)

var roleNames = [...]string{"none", "system", "developer", "user", "assistant", "tool", "other"}

// String returns the role's name, such as "assistant".
func (r Role) String() string { return name(roleNames[:], int(r)) }

// MarshalText encodes the role as its name.
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Class says what kind of change made a prompt drift. It is decided from
// per-segment fingerprints only, never from stored content.
type Class uint8

// Drift classes. NumClasses bounds them, for arrays indexed by class.
const (
	ClassNone       Class = iota
	ClassDigits           // only digit runs changed: a timestamp, a counter, a random id made of digits
	ClassToolOrder        // the same tools in a different order
	ClassWhitespace       // only whitespace changed
	ClassTruncation       // history cut or summarized: fewer segments, or a segment cut short
	ClassOther            // anything else
	NumClasses
)

var classNames = [...]string{"none", "digits", "tool_order", "whitespace", "truncation", "other"}

// String returns the class's name, such as "tool_order".
func (c Class) String() string { return name(classNames[:], int(c)) }

// MarshalText encodes the class as its name.
func (c Class) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UntrackedReason says why Observe did not track a request.
type UntrackedReason uint8

// Reasons. NumUntrackedReasons bounds them, for arrays indexed by reason.
const (
	TrackedOK             UntrackedReason = iota // the request was tracked
	UntrackedNotJSON                             // the body is not a JSON object
	UntrackedUnknownShape                        // valid JSON, but no prompt where the protocol puts it (or an unknown protocol)
	UntrackedTooLarge                            // the body exceeds Config.MaxBodyBytes, or holds more than 65,536 messages
	UntrackedStateful                            // Responses previous_response_id or conversation: the body holds only the new turn
	NumUntrackedReasons
)

var reasonNames = [...]string{"ok", "not_json", "unknown_shape", "too_large", "stateful"}

// String returns the reason's name, such as "not_json".
func (r UntrackedReason) String() string { return name(reasonNames[:], int(r)) }

// MarshalText encodes the reason as its name.
func (r UntrackedReason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func name(names []string, i int) string {
	if i < len(names) {
		return names[i]
	}
	return "other"
}

// Drift locates and classifies where a request left the prompt of the
// conversation it continues. It holds only values; the zero value (Happened
// false) means no drift.
type Drift struct {
	Happened bool
	Segment  SegmentKind
	// MessageIndex is the index in the request's messages (or input) array of
	// the diverging message or system message; for tools, the index of the
	// first tool that differs; 0 for Responses instructions, the Anthropic
	// system field and completions prompts.
	MessageIndex int
	Role         Role
	// Offset is the byte offset of the first difference inside the segment's
	// canonical text (see the package comment; for completions prompts,
	// inside the whole prompt). Exact reports whether it is byte-exact; if
	// not, the difference lies at or after Offset: in the 64-byte block
	// that starts there, or anywhere past it at the 1 MiB mark.
	Offset int64
	Exact  bool
	Class  Class
	// LostBytes is how many bytes of the previous prompt follow the
	// difference: what the engine has to prefill again.
	LostBytes int64
}

// Result is what Observe learned about one request. It holds only values
// (no pointers, slices or strings), so copying it is always safe, and it
// never contains prompt text.
type Result struct {
	Tracked   bool
	Untracked UntrackedReason // why Tracked is false

	// PromptBytes is the size of the canonical prompt: the bytes of all
	// segments. ReusableBytes is the longest prefix of it that some earlier
	// request, still in the index, had too. Reuse is their ratio, or -1 when
	// unknown (untracked, or an empty prompt).
	PromptBytes       int64
	ReusableBytes     int64
	Reuse             float64
	ReusableTokensEst int64 // ReusableBytes / Config.BytesPerToken
	Segments          int   // how many segments the prompt has

	// The prompt's composition: PromptBytes split into the system
	// segments, the tools segment, the history (the messages up to and
	// including the last assistant message) and the last turn (the
	// messages after it: the new user input or tool results; every
	// message when none is from the assistant). Their sum is PromptBytes.
	// All are zero for completions prompts, which have no such structure,
	// and for untracked requests.
	SystemBytes   int64
	ToolsBytes    int64
	HistoryBytes  int64
	LastTurnBytes int64

	// ConversationID identifies the conversation the request continues (or
	// starts): a keyed hash, stable for the life of the Tracker and
	// meaningless outside it. Turn counts the earlier requests of that
	// conversation (0 for the first).
	ConversationID uint64
	Turn           int

	Drift Drift

	// Chain is the prompt's prefix fingerprints at its first and last
	// segment boundaries (ChainEnds each): keyed hashes and byte counts.
	Chain Chain

	// Masked is set when the request matches the previous one only because of
	// Config.VolatileFields or VolatilePatterns: the engine, which sees the
	// raw prompt, misses there; fixing those fields would let it hit.
	Masked bool

	// Set by Cache once the engine's usage is known. ExpectedCachedTokens is
	// Reuse × prompt tokens.
	CacheChecked         bool
	ExpectedCachedTokens int64
	MissDespiteReuse     bool
}

// DriftEvent is one drift, kept in a bounded ring for snapshots. It holds
// no content.
type DriftEvent struct {
	At             time.Time
	ConversationID uint64
	Turn           int
	Drift
}

// Stats are the Tracker's cumulative counters and index gauges. Arrays are
// indexed by the enums (slot 0, "none"/"ok", stays zero where it has no
// meaning).
type Stats struct {
	Tracked   uint64
	Untracked [NumUntrackedReasons]uint64
	Drifts    [NumSegmentKinds][NumClasses]uint64
	// MaskedDrifts counts requests with Result.Masked set.
	MaskedDrifts uint64

	// Sums over tracked requests, for an aggregate reuse ratio.
	PromptBytes   uint64
	ReusableBytes uint64

	// Cache comparisons (see Tracker.Cache).
	CacheChecked         uint64
	MissDespiteReuse     uint64
	ExpectedCachedTokens int64
	EngineCachedTokens   int64

	// The index.
	IndexBytes    int64 // accounted bytes, never above IndexCapBytes after an Observe returns
	IndexCapBytes int64
	IndexNodes    int // prefix entries (one per distinct segment prefix)
	Fingerprints  int // distinct segments
	Evictions     uint64
}
