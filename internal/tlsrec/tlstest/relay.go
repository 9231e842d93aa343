package tlstest

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay is a man in the middle for tests of TLS channel binding: it
// accepts connections, dials target for each, passes whatever plain
// exchange prefix does on unchanged, then runs TLS with each end on its
// own (as the server toward the dialer, the client toward target), with
// cfg's certificate, and copies the application data across. With a
// certificate of the job's CA it gets past both ends' TLS; only a binding
// of the ends' proofs to their TLS sessions stops it.
type Relay struct {
	Addr string
	// Relayed counts the application-data bytes it copied.
	Relayed atomic.Int64
	ln      net.Listener
}

// NewRelay starts a relay toward target; the test's end closes it.
func NewRelay(t testing.TB, target string, cfg *tls.Config, prefix func(dialer, target net.Conn) error) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{Addr: ln.Addr().String(), ln: ln}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			mu.Lock()
			open = append(open, a, b)
			mu.Unlock()
			wg.Go(func() {
				defer a.Close()
				defer b.Close()
				if prefix != nil {
					if err := prefix(a, b); err != nil {
						return
					}
				}
				ta, tb := tls.Server(a, cfg), tls.Client(b, cfg)
				if ta.Handshake() != nil || tb.Handshake() != nil {
					return
				}
				var cp sync.WaitGroup
				pipe := func(dst, src *tls.Conn) {
					n, _ := io.Copy(dst, src)
					r.Relayed.Add(n)
					dst.Close()
					src.Close()
				}
				cp.Go(func() { pipe(tb, ta) })
				cp.Go(func() { pipe(ta, tb) })
				cp.Wait()
			})
		}
	})
	return r
}
