package auth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSFiles names the PEM files of a rank's TLS settings.
type TLSFiles struct {
	// CA holds the certificate(s) of the authority that signs every
	// rank's (and etcd's) certificate.
	CA string
	// Cert holds this host's certificate chain, valid for the names or
	// addresses other ranks dial it by, for both server and client use.
	Cert string
	// Key holds the certificate's private key.
	Key string
}

// IsZero reports whether no file is named: TLS is off.
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// Load reads the three files. All three must be named.
func (f TLSFiles) Load() (*TLS, error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, fmt.Errorf("auth: TLS needs a CA, a certificate and a key file (got CA %q, certificate %q, key %q)", f.CA, f.Cert, f.Key)
	}
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("auth: TLS CA: %w", err)
	}
	ca := x509.NewCertPool()
	if !ca.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("auth: TLS CA file %s holds no PEM certificate", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("auth: TLS certificate %s and key %s: %w", f.Cert, f.Key, err)
	}
	t := NewTLS(ca, cert)
	t.files = f
	return t, nil
}

// TLS is a rank's TLS identity and trust: the authority whose certificates
// it accepts, and its own certificate. Every connection is mutual TLS 1.3:
// both ends present a certificate the authority signed. A nil *TLS means
// plain connections.
type TLS struct {
	ca    *x509.CertPool
	cert  tls.Certificate
	files TLSFiles
}

// NewTLS makes a TLS of a certificate pool and a certificate.
func NewTLS(ca *x509.CertPool, cert tls.Certificate) *TLS {
	return &TLS{ca: ca, cert: cert}
}

// Files returns the files the settings were loaded from (a server that
// wants file names, such as an embedded etcd, needs them), or the zero
// TLSFiles for settings made by NewTLS.
func (t *TLS) Files() TLSFiles { return t.files }

// Server is the configuration of the accepting end: it presents this
// rank's certificate and requires a client certificate that the authority
// signed.
func (t *TLS) Server() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		ClientCAs:    t.ca,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
}

// Client is the configuration of the connecting end: it verifies that the
// server's certificate, signed by the authority, is valid for serverName
// (the host or address it dials), and presents this rank's certificate.
func (t *TLS) Client(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		RootCAs:      t.ca,
		ServerName:   serverName,
	}
}

// bindingLabel is the TLS exporter label of the channel binding (RFC 5705,
// RFC 8446 section 7.5).
const bindingLabel = "EXPORTER-weightcast-channel-binding"

// TLSBinding returns the channel binding of a TLS connection: keying
// material exported from its handshake, the same on both ends of one
// connection and different on any other. A proof that covers it cannot be
// relayed to another connection.
func TLSBinding(cs tls.ConnectionState) ([]byte, error) {
	if !cs.HandshakeComplete {
		return nil, errors.New("auth: channel binding of a TLS connection before its handshake")
	}
	return cs.ExportKeyingMaterial(bindingLabel, nil, KeySize)
}
