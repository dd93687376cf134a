// Package authtest makes what tests of authenticated connections need: a
// certificate authority of their own and certificates it signs, written to
// the test's temporary directory, and group secrets. Nothing here is for
// use outside tests.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
)

// Loopback are the names a certificate for a test on loopback is valid
// for.
var Loopback = []string{"127.0.0.1", "::1", "localhost"}

// CA is a certificate authority made for one test.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	dir  string
	n    atomic.Int64
}

// NewCA makes a certificate authority whose files live in the test's
// temporary directory.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "weightcast test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), dir: t.TempDir()}
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Issue makes a certificate valid for names (IP addresses or DNS names;
// Loopback when none are given), for both server and client use, writes it,
// its key and the CA's certificate as PEM files and returns their paths.
func (ca *CA) Issue(t testing.TB, names ...string) auth.TLSFiles {
	t.Helper()
	if len(names) == 0 {
		names = Loopback
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	i := ca.n.Add(1)
	f := auth.TLSFiles{
		CA:   filepath.Join(ca.dir, "ca.pem"),
		Cert: filepath.Join(ca.dir, fmt.Sprintf("cert%d.pem", i)),
		Key:  filepath.Join(ca.dir, fmt.Sprintf("key%d.pem", i)),
	}
	write(t, f.CA, ca.pem)
	write(t, f.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	write(t, f.Key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	return f
}

// TLS is Issue's files, loaded.
func (ca *CA) TLS(t testing.TB, names ...string) *auth.TLS {
	t.Helper()
	tl, err := ca.Issue(t, names...).Load()
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Secret returns a fresh random group secret.
func Secret(t testing.TB) *auth.Secret {
	t.Helper()
	b := make([]byte, 32)
	rand.Read(b)
	s, err := auth.NewSecret(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Keys returns the keys of run of group under s.
func Keys(t testing.TB, s *auth.Secret, group, run string) *auth.Keys {
	t.Helper()
	k, err := s.RunKeys(group, run)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
