// Package tlstest wraps tlsrec's throwaway CA for tests: each call fails
// the test instead of returning an error.
package tlstest

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/goccl/goccl/internal/tlsrec"
)

// CA is a certificate authority that lives for one test.
type CA struct{ *tlsrec.CA }

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := tlsrec.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{ca}
}

// Issue makes a certificate for name (see tlsrec.CA.Issue).
func (ca *CA) Issue(t testing.TB, name string, usages ...x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	c, err := ca.CA.Issue(name, usages...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteFiles writes the CA and a certificate for name as PEM files in dir.
func (ca *CA) WriteFiles(t testing.TB, dir, name string) tlsrec.Files {
	t.Helper()
	f, err := ca.CA.WriteFiles(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
