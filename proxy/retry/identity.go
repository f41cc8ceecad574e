package retry

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"strconv"
)

// HeaderRetryCount is the retry-attempt header of the Stainless-generated
// SDKs (OpenAI and Anthropic, for Python, Node and Go): "0" on the first
// try, n on the n-th retry. Sent alongside X-Stainless-Timeout.
const HeaderRetryCount = "X-Stainless-Retry-Count"

// ParseRetryCount parses a HeaderRetryCount value as Request.RetryHeader:
// -1 when absent (empty) or not a small decimal number. It does not
// allocate.
func ParseRetryCount(v []byte) int {
	if len(v) == 0 || len(v) > 6 {
		return -1
	}
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// ClientID is a client's identity: a keyed hash of its credentials,
// address and User-Agent (see Request). The key is random per Tracker, so
// a ClientID is stable only within one process and cannot be matched to
// credentials outside it. It prints and marshals as 16 hex
// digits: JSON numbers lose precision above 2^53.
type ClientID uint64

func (id ClientID) String() string {
	b := id.hex()
	return string(b[:])
}

// MarshalText writes the 16 hex digits.
func (id ClientID) MarshalText() ([]byte, error) {
	b := id.hex()
	return b[:], nil
}

// UnmarshalText reads the 16 hex digits back, for snapshot files.
func (id *ClientID) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(string(b), 16, 64)
	if err != nil || len(b) != 16 {
		return fmt.Errorf("retry: client id %q: want 16 hex digits", b)
	}
	*id = ClientID(v)
	return nil
}

func (id ClientID) hex() (b [16]byte) {
	const digits = "0123456789abcdef"
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = digits[id&0xf]
		id >>= 4
	}
	return b
}

// v4InV6 is the prefix of an IPv4-mapped IPv6 address (RFC 4291 §2.5.5.2).
var v4InV6 = []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff}

// clientID hashes r's identity fields. Each field is length-prefixed, so
// that moving bytes from one field to the next changes the hash.
func (t *Tracker) clientID(r *Request) ClientID {
	ip := r.RemoteIP
	if len(ip) == 16 && bytes.HasPrefix(ip, v4InV6) {
		ip = ip[12:] // net.IP holds IPv4 in either length
	}
	var h maphash.Hash
	h.SetSeed(t.seed)
	for _, f := range [...][]byte{r.Auth, r.APIKey, ip, r.UserAgent} {
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return ClientID(h.Sum64())
}
