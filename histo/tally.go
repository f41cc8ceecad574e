package histo

// windowTally is the shape of every per-window tally of one concern
// (retry, prefix, ledger, knee, conversations, cache): T is the tally, S
// its section of the Window and of the v1 extension. clone copies it under
// Recorder.mu for Current, sharing nothing that a later add modifies;
// section summarizes it, outside the lock. Each tally's add is not part of
// the interface: Recorder.add calls it directly, because an interface call
// would move Record's Request to the heap (TestRecordAllocs).
type windowTally[T, S any] interface {
	clone() T
	section() *S
}

var (
	_ windowTally[retryTally, RetrySection]        = (*retryTally)(nil)
	_ windowTally[prefixTally, PrefixSection]      = (*prefixTally)(nil)
	_ windowTally[ledgerTally, LedgerSection]      = (*ledgerTally)(nil)
	_ windowTally[kneeTally, ConcurrencySection]   = (*kneeTally)(nil)
	_ windowTally[convTally, ConversationsSection] = (*convTally)(nil)
	_ windowTally[cacheTally, CacheSection]        = (*cacheTally)(nil)
)

// tallies are a window's per-concern tallies, guarded by Recorder.mu with
// the window they are part of.
type tallies struct {
	retry  retryTally
	prefix prefixTally
	ledger ledgerTally
	knee   kneeTally
	conv   convTally
	cache  cacheTally
}

// clone copies every tally, for Current.
func (t *tallies) clone() tallies {
	return tallies{retry: t.retry.clone(), prefix: t.prefix.clone(), ledger: t.ledger.clone(),
		knee: t.knee.clone(), conv: t.conv.clone(), cache: t.cache.clone()}
}

// put writes every tally's section into out.
func (t *tallies) put(out *Window) {
	out.Retry = t.retry.section()
	out.Prefix = t.prefix.section()
	out.Conversations = t.conv.section()
	out.Ledger = t.ledger.section()
	out.Concurrency = t.knee.section()
	out.Cache = t.cache.section()
}
