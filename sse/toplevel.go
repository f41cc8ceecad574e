package sse

import "bytes"

// Results of TopLevelString.
const (
	KeyAbsent  = iota // b is an object without the key, or its value is not a string
	KeyFound          // the value is returned
	KeyUnknown        // b is not an object, is malformed, or has a key with an escape: decode it to be sure
)

// TopLevelString finds key among the top-level keys of the JSON object b
// and returns the raw contents of its string value, escapes intact. A key
// that repeats is the last one, as encoding/json and Python's json module
// read it. Keys are compared byte for byte, so a key written with an
// escape ("mod\u0065l") makes the answer KeyUnknown rather than a guess.
//
// It walks the top level only, skipping nested values at the speed of
// bytes.IndexByte over their strings, and never allocates: reading a
// request's "model" costs microseconds for a body of hundreds of KB, where
// decoding it costs milliseconds. It reads with Scanner, as the
// classifiers and the prefix tracker do. It is safe for concurrent use.
func TopLevelString(b []byte, key string) (raw []byte, result int) {
	s := NewScanner(b)
	if !s.Object() {
		return nil, KeyUnknown
	}
	result = KeyAbsent
	for {
		k := s.Key()
		if s.Bad() {
			return nil, KeyUnknown
		}
		if k == nil {
			return raw, result
		}
		if bytes.IndexByte(k, '\\') >= 0 {
			return nil, KeyUnknown
		}
		if string(k) != key {
			s.Skip()
			continue
		}
		if raw = s.Str(); raw != nil {
			result = KeyFound
		} else {
			result = KeyAbsent
		}
	}
}
