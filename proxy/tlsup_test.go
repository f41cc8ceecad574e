package proxy

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testCA is a self-signed certificate for 127.0.0.1 and the pool that
// trusts it, made once per test binary.
var testCA = sync.OnceValues(func() (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "anvilproxy test upstream"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, roots
})

// batchConn holds what crypto/tls writes while holding is on and sends it
// in one write at flush, so that several TLS records reach the proxy in
// one segment, as they do from a busy engine. Used by one goroutine.
type batchConn struct {
	net.Conn
	holding bool
	buf     []byte
}

func (b *batchConn) Write(p []byte) (int, error) {
	if b.holding {
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	return b.Conn.Write(p)
}

func (b *batchConn) hold() { b.holding = true }

// flush sends the first n held bytes (all when n < 0) and keeps the rest.
func (b *batchConn) flush(n int) error {
	if n < 0 || n > len(b.buf) {
		n = len(b.buf)
	}
	_, err := b.Conn.Write(b.buf[:n])
	b.buf = b.buf[n:]
	b.holding = len(b.buf) > 0
	return err
}

// tlsPeer is one accepted TLS connection of a tlsUpstream.
type tlsPeer struct {
	*tls.Conn
	batch *batchConn
}

// startTLSUpstream is startRawUpstream over TLS, with the certificate of
// testCA; its URL is https, and Config.UpstreamRootCAs trusts it.
func startTLSUpstream(t *testing.T, serve func(u *rawUpstream, c *tlsPeer, br *bufio.Reader)) (*rawUpstream, string) {
	cert, _ := testCA()
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, _ *bufio.Reader) {
		bc := &batchConn{Conn: c}
		tc := tls.Server(bc, cfg)
		if tc.Handshake() != nil {
			return
		}
		serve(u, &tlsPeer{Conn: tc, batch: bc}, bufio.NewReader(tc))
	})
	return up, strings.Replace(up.URL(), "http://", "https://", 1)
}

// TestTLSExtraRecordNeverReused: bytes beyond a response that crypto/tls
// already read from the socket are invisible to the reader's Buffered and
// to a socket peek. A whole extra record, or part of one, left behind a
// response closes the connection: the next request of the same client
// gets its own answer on a new connection, never those bytes.
func TestTLSExtraRecordNeverReused(t *testing.T) {
	const extra = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"
	for _, tc := range []struct {
		name string
		sent func(answer int) int // how many held bytes the first flush sends
	}{
		{"whole record", func(int) int { return -1 }},
		{"part of a record", func(answer int) int { return answer + 10 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var conns atomic.Int32
			up, url := startTLSUpstream(t, func(u *rawUpstream, c *tlsPeer, br *bufio.Reader) {
				first := conns.Add(1) == 1
				for {
					if _, _, err := u.readRequest(br); err != nil {
						return
					}
					if !first {
						io.WriteString(c, taggedAnswer("second"))
						continue
					}
					first = false
					answer := taggedAnswer("first")
					c.batch.hold()
					io.WriteString(c, answer) // one record
					before := len(c.batch.buf)
					io.WriteString(c, extra) // one more record
					_ = c.batch.flush(tc.sent(before))
				}
			})
			_, roots := testCA()
			log := newTraceLog()
			base, p := startProxy(t, Config{Upstream: url, UpstreamRootCAs: roots, UpstreamReadTimeout: 2 * time.Second}, log)
			client := keepAliveClient(t)
			require.Equal(t, "first", string(postOn(t, client, base+"/v1/models", "").body))
			log.next(t)
			got := postOn(t, client, base+"/v1/models", "")
			require.Equal(t, "second", string(got.body), "bytes crypto/tls held answered the next request")
			require.Equal(t, int32(2), up.accepted.Load())
			require.Equal(t, uint64(1), p.Stats().Redials(RedialUnsolicited))
		})
	}
}
