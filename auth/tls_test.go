package auth_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/auth/authtest"
)

// handshake connects a client of cli (dialing name) to a server of srv
// over loopback and returns both ends' errors and channel bindings.
func handshake(t *testing.T, srv, cli *auth.TLS, name string) (serr, cerr error, sb, cb []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			serr = err
			return
		}
		defer c.Close()
		tc := tls.Server(c, srv.Server())
		if serr = tc.HandshakeContext(ctx); serr == nil {
			sb, serr = auth.TLSBinding(tc.ConnectionState())
			tc.Write([]byte{1}) // lets the client see a refusal of its certificate
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := tls.Client(c, cli.Client(name))
	if cerr = tc.HandshakeContext(ctx); cerr == nil {
		var one [1]byte
		if _, cerr = tc.Read(one[:]); cerr == nil {
			cb, cerr = auth.TLSBinding(tc.ConnectionState())
			if tc.ConnectionState().Version != tls.VersionTLS13 {
				t.Errorf("negotiated TLS version %x, want 1.3", tc.ConnectionState().Version)
			}
		}
	}
	c.Close()
	<-done
	return serr, cerr, sb, cb
}

func TestMutualTLS(t *testing.T) {
	ca := authtest.NewCA(t)
	a, b := ca.TLS(t), ca.TLS(t)
	serr, cerr, sb, cb := handshake(t, a, b, "127.0.0.1")
	if serr != nil || cerr != nil {
		t.Fatalf("handshake between two certificates of one CA: server %v, client %v", serr, cerr)
	}
	if len(sb) != auth.KeySize || !bytes.Equal(sb, cb) {
		t.Fatalf("channel bindings %x and %x: want the same %d bytes on both ends", sb, cb, auth.KeySize)
	}
	_, _, sb2, _ := handshake(t, a, b, "localhost")
	if bytes.Equal(sb, sb2) {
		t.Fatal("two connections have the same channel binding")
	}

	stranger := authtest.NewCA(t).TLS(t)
	if serr, cerr, _, _ := handshake(t, a, stranger, "127.0.0.1"); serr == nil || cerr == nil {
		t.Errorf("a client with another CA's certificate: server %v, client %v; want both to fail", serr, cerr)
	}
	if _, cerr, _, _ := handshake(t, stranger, a, "127.0.0.1"); cerr == nil || !strings.Contains(cerr.Error(), "certificate") {
		t.Errorf("a server with another CA's certificate: client %v; want a certificate error", cerr)
	}
	if _, cerr, _, _ := handshake(t, ca.TLS(t, "10.9.9.9"), a, "127.0.0.1"); cerr == nil {
		t.Error("a server whose certificate names another host was accepted")
	}
	if _, err := auth.TLSBinding(tls.ConnectionState{}); err == nil {
		t.Error("a channel binding before the handshake")
	}
}

func TestTLSFiles(t *testing.T) {
	ca := authtest.NewCA(t)
	f := ca.Issue(t)
	tl, err := f.Load()
	if err != nil {
		t.Fatal(err)
	}
	if tl.Files() != f || f.IsZero() || !(auth.TLSFiles{}).IsZero() {
		t.Fatalf("Files() = %+v after loading %+v", tl.Files(), f)
	}
	for name, bad := range map[string]auth.TLSFiles{
		"no key":       {CA: f.CA, Cert: f.Cert},
		"CA not PEM":   {CA: f.Key + "x", Cert: f.Cert, Key: f.Key},
		"key mismatch": {CA: f.CA, Cert: f.Cert, Key: ca.Issue(t).Key},
		"cert as CA":   {CA: f.Key, Cert: f.Cert, Key: f.Key},
	} {
		if _, err := bad.Load(); err == nil {
			t.Errorf("%s: Load succeeded", name)
		}
	}
	srv := tl.Server()
	if srv.MinVersion != tls.VersionTLS13 || srv.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("server config: min version %x, client auth %v", srv.MinVersion, srv.ClientAuth)
	}
}
