package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/auth/authtest"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
)

// These tests run the attacks of an outsider on the same host against real
// rank processes on loopback.

// secretFile writes a fresh group secret to a file of mode 0600.
func secretFile(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	rand.Read(b)
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// etcdStore starts an etcd (serving TLS with tls, when set) and returns
// its demo endpoint and a client of the test's own, as an outsider with
// access to etcd has.
func etcdStore(t *testing.T, tls auth.TLSFiles) (string, *rendezvous.Etcd) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	emb, err := embedetcd.Start(ctx, embedetcd.Options{TLS: tls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emb.Close() })
	var opts []rendezvous.EtcdOption
	if !tls.IsZero() {
		tl, err := tls.Load()
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, rendezvous.WithTLS(tl))
	}
	s, err := rendezvous.DialEtcd(ctx, []string{emb.ClientURL()}, 10*time.Second, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	hostPort := strings.TrimPrefix(strings.TrimPrefix(emb.ClientURL(), "http://"), "https://")
	return "etcd://" + hostPort, s
}

// waitKey waits (20 s at most) until key exists and returns its value.
func waitKey(t *testing.T, s *rendezvous.Etcd, key string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v, err := s.Wait(ctx, key)
	if err != nil {
		t.Fatalf("waiting for %s: %v", key, err)
	}
	return v
}

// mustSucceed waits for every rank and checks each synced and verified
// every round.
func mustSucceed(t *testing.T, ps []*rankProc, rounds int) {
	t.Helper()
	for _, p := range ps {
		if err := p.wait(t, 90*time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", p.rank, err, p.err.String())
		}
		if r := p.summary(t).PerRank[0]; len(r.Rounds) != rounds || r.Error != "" || (p.rank > 0 && !r.Verified) {
			t.Fatalf("rank %d: %+v", p.rank, r)
		}
	}
}

// TestSecretAndTLS runs four ranks with a group secret, and with the secret
// and mutual TLS for etcd, the tcp chain and the bus: they sync and verify.
func TestSecretAndTLS(t *testing.T) {
	secret := secretFile(t)
	ca := authtest.NewCA(t)
	files := ca.Issue(t)
	for _, c := range []struct {
		name string
		tls  auth.TLSFiles
		mac  string
	}{{"secret", auth.TLSFiles{}, "blake3"}, {"secret, Poly1305-AES", auth.TLSFiles{}, "poly1305-aes"}, {"secret and TLS", files, "blake3"}} {
		tls := c.tls
		t.Run(c.name, func(t *testing.T) {
			etcd, _ := etcdStore(t, tls)
			args := append(append([]string{}, small...), "--rounds", "2", "--secret-file", secret, "--bucket-mac", c.mac)
			if !tls.IsZero() {
				args = append(args, "--tls-ca", tls.CA, "--tls-cert", tls.Cert, "--tls-key", tls.Key)
			}
			mustSucceed(t, startAll(t, etcd, "secured", "r1", 4, args...), 2)
		})
	}
}

// TestStrangerTakesRank: an outsider who knows the group, run id and world
// size (they are in etcd and the process list) but not the secret starts
// as rank 2 before the real one. It is refused, the real rank 2 takes its
// place, and the run completes verified.
func TestStrangerTakesRank(t *testing.T) {
	secret := secretFile(t)
	etcd, s := etcdStore(t, auth.TLSFiles{})
	stranger := startRank(t, etcd, "takeover", "r1", 2, 4, "--size", "4MiB", "--tensors", "30", "--bucket", "256KiB", "--timeout", "5s")
	waitKey(t, s, "/weightcast/takeover/r1/ranks/2")
	ps := startAll(t, etcd, "takeover", "r1", 4, append(append([]string{}, small...), "--rounds", "2", "--secret-file", secret)...)
	mustSucceed(t, ps, 2)
	if err := stranger.wait(t, 60*time.Second); err == nil {
		t.Fatal("the stranger's rank 2 synced")
	}
	if e := stranger.summary(t).PerRank[0].Error; !strings.Contains(e, "authentication failed") && !strings.Contains(e, "deleted") {
		t.Errorf("the stranger's error %q says neither authentication failed nor that its record was deleted", e)
	}
}

// TestDifferentSecrets: rank 1 is given another secret, or none: every rank
// exits 1 within the join deadline, saying "authentication failed".
func TestDifferentSecrets(t *testing.T) {
	a, b := secretFile(t), secretFile(t)
	for name, rank1 := range map[string][]string{"another": {"--secret-file", b}, "none": nil} {
		t.Run(name, func(t *testing.T) {
			etcd, _ := etcdStore(t, auth.TLSFiles{})
			base := []string{"--size", "4MiB", "--tensors", "30", "--bucket", "256KiB", "--timeout", "5s"}
			ps := make([]*rankProc, 3)
			start := time.Now()
			for r := range 3 {
				args := append(append([]string{}, base...), "--secret-file", a)
				if r == 1 {
					args = append(append([]string{}, base...), rank1...)
				}
				ps[r] = startRank(t, etcd, "secrets", "r1", r, 3, args...)
			}
			for _, p := range ps {
				if err := p.wait(t, 40*time.Second); err == nil {
					t.Fatalf("rank %d synced", p.rank)
				}
				if e := p.summary(t).PerRank[0].Error; !strings.Contains(e, "authentication failed") {
					t.Errorf("rank %d: %q; want authentication failed", p.rank, e)
				}
			}
			if d := time.Since(start); d > 25*time.Second {
				t.Errorf("the ranks took %v to fail; the join deadline is 5s", d)
			}
		})
	}
}

// TestRecordDeleted: an outsider deletes rank 2's record in etcd while the
// run goes on: every rank stops saying exactly that, not that a lease
// expired or a rank died.
func TestRecordDeleted(t *testing.T) {
	etcd, s := etcdStore(t, auth.TLSFiles{})
	ps := startAll(t, etcd, "deleted", "r1", 4, "--size", "4MiB", "--tensors", "30", "--bucket", "256KiB", "--timeout", "20s", "--rounds", "100000")
	waitKey(t, s, "/weightcast/deleted/r1/join/done")
	time.Sleep(500 * time.Millisecond)
	if err := s.DeletePrefix(context.Background(), "/weightcast/deleted/r1/ranks/2"); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if err := p.wait(t, 30*time.Second); err == nil {
			t.Fatalf("rank %d went on", p.rank)
		}
		// A rank hears it from its own watch, or from a neighbour that
		// stopped for it first: either way the error names rank 2's key
		// and says the record was deleted.
		e := p.summary(t).PerRank[0].Error
		if !strings.Contains(e, "record was deleted") || !strings.Contains(e, `deleted/r1/ranks/2"`) {
			t.Errorf("rank %d: %q; want it to say that rank 2's record was deleted", p.rank, e)
		}
		if strings.Contains(e, "lease expired") || strings.Contains(e, "is gone") {
			t.Errorf("rank %d: %q blames a lease or a dead rank", p.rank, e)
		}
	}
}

// TestGarbageDoesNotFailTheRun: without a secret, an outsider reads the
// metadata bus's and the tcp chain's addresses from etcd and sends them
// garbage, a frame of protocol version 0 and a HELLO for a rank that has
// joined: the run completes verified. It runs over tcp, whose chain the
// outsider also sends garbage to, with or without GPUs.
func TestGarbageDoesNotFailTheRun(t *testing.T) {
	etcd, s := etcdStore(t, auth.TLSFiles{})
	// tcp on GPU hosts too: the outsider attacks the tcp chain's socket.
	ps := startAll(t, etcd, "garbage", "r1", 3, append(append([]string{}, small...), "--rounds", "30", "--transport", "tcp")...)
	bus := strings.TrimPrefix(string(waitKey(t, s, "/weightcast/garbage/r1/data/0/meta.addr")), "tcp://")
	chain := string(waitKey(t, s, "/weightcast/garbage/r1/data/2/tcp.addr"))
	for _, addr := range []string{bus, chain} {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
			c.Close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, frames := range [][][]byte{
		{{'W', 'C', 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},                            // protocol version 0
		{{'W', 'C', 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, helloFor(1, 3, "garbage")}, // HELLO for joined rank 1
	} {
		d := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("r1.outsider")))
		if err := d.Dial("tcp://" + bus); err == nil {
			d.SendMulti(zmq4.NewMsgFrom(frames...))
			time.Sleep(100 * time.Millisecond)
		}
		d.Close()
	}
	mustSucceed(t, ps, 30)
}

// helloFor is a HELLO body (docs/protocol.md) for rank of world in group.
func helloFor(rank, world uint32, group string) []byte {
	b := make([]byte, 26, 26+len(group))
	b[0], b[4] = byte(rank), byte(world)
	b[8], b[10] = 0, 1 // max_message 64 KiB
	b[16], b[17] = 0xe8, 3
	b[20], b[21] = 0xb8, 0x0b
	b[24] = byte(len(group))
	return append(b, group...)
}
