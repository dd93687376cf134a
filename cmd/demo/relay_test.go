package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/checksum/checksumtest"
	"github.com/weightcast/weightcast/internal/testhook"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/tcp"
)

// TestRelayForgesBucket is the man in the middle of a tcp chain, placed
// between ranks 1 and 2 of a 4-rank run of real processes. With a secret
// the rendezvous records are signed, so the relay sits below the
// signature: rank 1 is the test binary running the demo (relayedRank),
// whose transports find rank 2's address through a hook that answers with
// the relay's, after the rendezvous checked the real record; the relay
// dials rank 2's real address. It passes the handshake through (plain TCP:
// no channel binding for the proofs to cover) and every byte but those of
// the second bucket of round 2, whose first 64 bytes it changes, solving
// the next 8 so that the bucket's checksum stays the same
// (checksumtest.Forge).
//
// Without a secret the checksum is fooled: rank 2 takes the forged bucket,
// and only the demo's --verify comparison notices. With a secret the round
// fails with a MAC mismatch naming the bucket, every rank is out within
// seconds, and every rank still has version 1 committed.
func TestRelayForgesBucket(t *testing.T) {
	for _, secret := range []bool{false, true} {
		t.Run(map[bool]string{false: "no secret", true: "secret"}[secret], func(t *testing.T) {
			etcd, store := etcdStore(t, auth.TLSFiles{})
			rl := startRelay(t, func() (string, error) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				v, err := store.Wait(ctx, "/weightcast/relay/r1/data/2/tcp.addr")
				addr, _, _ := bytes.Cut(v, []byte("\nwcmac1:")) // the record's signature, with a secret
				return string(addr), err
			})
			args := []string{"--transport", "tcp", "--size", "4MiB", "--tensors", "30", "--bucket", "256KiB", "--timeout", "30s", "--rounds", "3"}
			if secret {
				args = append(args, "--secret-file", secretFile(t))
			}
			ps := make([]*rankProc, 4)
			for r := range 4 {
				if r == 1 {
					ps[r] = startRankOf(t, os.Args[0], []string{relayEnv + "=" + rl.ln.Addr().String()}, etcd, "relay", "r1", r, 4, args...)
				} else {
					ps[r] = startRank(t, etcd, "relay", "r1", r, 4, args...)
				}
			}
			var seq uint64
			select {
			case seq = <-rl.forged:
			case <-ps[1].done:
				t.Fatalf("rank 1 ended before the relay forged a bucket: %v\n%s\n%s", ps[1].exit, ps[1].out.String(), ps[1].err.String())
			case <-time.After(90 * time.Second):
				t.Fatal("the relay forged no bucket within 90s")
			}
			forgedAt := time.Now()
			for _, p := range ps {
				if err := p.wait(t, 60*time.Second); err == nil {
					t.Fatalf("rank %d completed the run with a forged bucket", p.rank)
				}
			}
			last := forgedAt
			for _, p := range ps {
				if p.exited.After(last) {
					last = p.exited
				}
			}
			for _, p := range ps {
				r := p.summary(t).PerRank[0]
				if r.CommittedVersion != 1 {
					t.Errorf("rank %d: committed version %d, want 1 (the round before the forgery)", p.rank, r.CommittedVersion)
				}
				if p.rank > 0 && r.State != "intact" {
					t.Errorf("rank %d: state %q", p.rank, r.State)
				}
			}
			e := ps[2].summary(t).PerRank[0].Error
			t.Logf("bucket %d forged; rank 2: %s", seq, e)
			if !secret {
				// The forgery passed the checksum; the comparison with the
				// source, which a real receiver does not have, caught it.
				if strings.Contains(e, "checksum") || !strings.Contains(e, "differs from the source") {
					t.Fatalf("rank 2 failed with %q; want the checksum fooled and --verify to notice", e)
				}
				return
			}
			want := fmt.Sprintf("bucket %d (version 2, ", seq)
			if !strings.Contains(e, want) || !strings.Contains(e, "failed its MAC") {
				t.Fatalf("rank 2 failed with %q; want a MAC mismatch naming %q", e, want)
			}
			if d := last.Sub(forgedAt); d > 15*time.Second {
				t.Errorf("the last rank left %v after the forgery; the timeout is 30s, the failure should travel at once", d)
			}
		})
	}
}

// relayEnv, set for a rank run by the test binary (relayedRank), names
// the relay's address.
const relayEnv = "WEIGHTCAST_TEST_RELAY"

// relayedRank runs the demo as a rank whose transports see relay as rank
// 2's tcp address, once rank 2 has published its own.
func relayedRank(relay string) int {
	testhook.Exchange = func(x transport.Exchange) transport.Exchange { return relayedExchange{x, relay} }
	ctx, stop := stopOnSignal(context.Background())
	defer stop()
	return run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
}

// relayedExchange answers with relay for rank 2's tcp address.
type relayedExchange struct {
	transport.Exchange
	relay string
}

func (x relayedExchange) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	v, err := x.Exchange.Get(ctx, rank, key)
	if err == nil && rank == 2 && key == tcp.AddrKey {
		return []byte(x.relay), nil
	}
	return v, err
}

// relay listens on a loopback port and runs each connection it accepts
// through to the address target gives, forging one bucket on the way
// downstream (see TestRelayForgesBucket).
type relay struct {
	t      *testing.T
	ln     net.Listener
	target func() (string, error) // rank 2's real address
	forged chan uint64            // the sequence number of the forged bucket
	wg     sync.WaitGroup
}

func startRelay(t *testing.T, target func() (string, error)) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &relay{t: t, ln: ln, target: target, forged: make(chan uint64, 1)}
	var conns sync.Map
	rl.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, nil)
			rl.wg.Go(func() { rl.serve(c, &conns) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		rl.wg.Wait()
	})
	return rl
}

// serve relays up, a connection from rank 1, to rank 2.
func (rl *relay) serve(up net.Conn, conns *sync.Map) {
	defer up.Close()
	addr, err := rl.target()
	if err != nil {
		rl.t.Errorf("relay: %v", err)
		return
	}
	down, err := net.Dial("tcp", addr)
	if err != nil {
		rl.t.Errorf("relay: dialing rank 2 at %s: %v", addr, err)
		return
	}
	conns.Store(down, nil)
	defer down.Close()
	rl.wg.Go(func() {
		io.Copy(up, down) // acknowledgements and verdicts, untouched
		up.Close()
	})
	if err := rl.forward(down, bufio.NewReader(up)); err != nil && !isClosed(err) {
		rl.t.Errorf("relay: %v", err)
	}
}

// isClosed reports an error of a connection that one end closed: rank 2
// hanging up on the relay once its round failed.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// forward copies the tcp chain's downstream stream from r to w as
// docs/protocol.md lays it out: the dialer's hello, its verdict (and proof,
// with a secret), then frames. It forges the first chunk of the second
// bucket of round 2 (a round starts where the buckets' sequence numbers
// jump: the commit message sits between rounds).
func (rl *relay) forward(w io.Writer, r *bufio.Reader) error {
	read := func(n int) ([]byte, error) {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err
	}
	copyN := func(n int) ([]byte, error) {
		b, err := read(n)
		if err == nil {
			_, err = w.Write(b)
		}
		return b, err
	}
	hello, err := copyN(49) // magic, version, flags, rank, world, nonce, group length
	if err != nil {
		return err
	}
	group, err := copyN(int(binary.BigEndian.Uint16(hello[47:])) + 2)
	if err != nil {
		return err
	}
	if _, err := copyN(int(binary.BigEndian.Uint16(group[len(group)-2:]))); err != nil {
		return err
	}
	verdict, err := copyN(3)
	if err != nil {
		return err
	}
	if _, err := copyN(int(binary.BigEndian.Uint16(verdict[1:]))); err != nil {
		return err
	}
	if hello[6]&1 != 0 && verdict[0] == 0 {
		if _, err := copyN(auth.KeySize); err != nil { // the dialer's proof
			return err
		}
	}
	var round, index int
	var prev, target uint64
	for {
		hdr, err := read(32)
		if err != nil {
			return err
		}
		if m := binary.BigEndian.Uint32(hdr); m != 0x77637470 {
			return fmt.Errorf("frame magic %#x: the relay lost the stream", m)
		}
		kind, seq := hdr[6], binary.BigEndian.Uint64(hdr[8:])
		a, b := binary.BigEndian.Uint64(hdr[16:]), binary.BigEndian.Uint64(hdr[24:])
		var payload []byte
		switch kind {
		case 1: // bucket
			switch {
			case round == 0:
				round = 1
			case seq == prev+1:
				index++
			default:
				round, index = round+1, 0
			}
			prev = seq
			if round == 2 && index == 1 {
				target = seq + 1
			}
		case 2, 3: // chunk, abort
			if payload, err = read(int(b)); err != nil {
				return err
			}
		}
		if kind == 2 && seq+1 == target && a == 0 {
			target = 0
			if len(payload) < checksumtest.ForgedLen {
				return fmt.Errorf("bucket %d's first chunk has %d bytes, too few to forge", seq, len(payload))
			}
			sum := checksum.Sum(payload)
			checksumtest.Forge(payload, 0)
			if checksum.Sum(payload) != sum {
				return fmt.Errorf("the forgery changed bucket %d's checksum", seq)
			}
			rl.forged <- seq
		}
		if _, err := w.Write(append(hdr, payload...)); err != nil {
			return err
		}
	}
}
