package stages

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/checksum/checksumtest"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// testKeys returns the keys of run run of group "g" under a fixed secret.
func testKeys(t testing.TB, run string) *auth.Keys {
	t.Helper()
	s, err := auth.NewSecret([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.RunKeys("g", run)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// macRecorder records, on the root, the bytes of each bucket as the
// transport moves them.
type macRecorder struct {
	transport.Endpoint
	mu    sync.Mutex
	bytes map[uint64][]byte
}

func (r *macRecorder) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	r.mu.Lock()
	r.bytes[seq] = bytes.Clone(buf.Host()[:n])
	r.mu.Unlock()
	return r.Endpoint.Broadcast(ctx, seq, buf, n)
}

// pubRecorder records every message the root publishes.
type pubRecorder struct {
	transport.Publisher
	mu   sync.Mutex
	msgs []transport.Message
}

func (p *pubRecorder) Publish(ctx context.Context, seq uint64, msg []byte) error {
	p.mu.Lock()
	p.msgs = append(p.msgs, transport.Message{Seq: seq, Data: bytes.Clone(msg)})
	p.mu.Unlock()
	return p.Publisher.Publish(ctx, seq, msg)
}

// TestSignedRounds: with the run's keys, rounds sync as without; every
// message on the bus is signed, and every bucket's metadata carries the
// MAC of the bytes the transport moved: keyed BLAKE3 under the bucket key,
// or Poly1305-AES under the Poly1305-AES key and a nonce of its own.
func TestSignedRounds(t *testing.T) {
	for _, kind := range mac.Kinds {
		t.Run(string(kind), func(t *testing.T) { testSignedRounds(t, kind) })
	}
}

func testSignedRounds(t *testing.T, kind mac.Kind) {
	keys := testKeys(t, "r1")
	g := newGroup(t, groupOpts{world: 3, bucket: 64 << 10, checksum: true, auth: keys, mac: kind})
	rec := &macRecorder{Endpoint: g.sender.cfg.Endpoint, bytes: map[uint64][]byte{}}
	pub := &pubRecorder{Publisher: g.sender.cfg.Publisher}
	g.sender.cfg.Endpoint, g.sender.cfg.Publisher = rec, pub
	models := []*memModel{newMemModel(), newShadowModel()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for v := uint64(1); v <= 3; v++ {
		want := roundModel(t, v)
		if err := g.round(ctx, want, v, []Sink{models[0], models[1]}); err != nil {
			t.Fatal(err)
		}
		for i, m := range models {
			if err := sameAs(m, want); err != nil {
				t.Fatalf("receiver %d, version %d: %v", i+1, v, err)
			}
		}
	}
	buckets, commits := 0, 0
	nonces := map[mac.Nonce]bool{}
	for _, m := range pub.msgs {
		if _, err := wire.Open(nil, m.Seq, m.Data); err == nil { // without keys, only a signed message fails
			t.Fatalf("message %d went out unsigned: %s", m.Seq, wire.Excerpt(m.Data))
		}
		body, err := wire.Open(keys, m.Seq, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wire.DecodeCommit(body); err == nil {
			commits++
			continue
		}
		meta, err := wire.DecodeMeta(body)
		if err != nil {
			t.Fatal(err)
		}
		moved, ok := rec.bytes[m.Seq]
		if !ok || !meta.HasMAC || (meta.MACNonce != nil) != (kind == mac.Poly1305AES) {
			t.Fatalf("bucket %d: moved %v, MAC set %v, nonce %v", m.Seq, ok, meta.HasMAC, meta.MACNonce)
		}
		want := mac.Sum(bucketKey(keys), moved)
		if kind == mac.Poly1305AES {
			if nonces[*meta.MACNonce] {
				t.Fatalf("bucket %d: nonce %s used before", m.Seq, meta.MACNonce)
			}
			nonces[*meta.MACNonce] = true
			want = mac.PolySum(polyKey(keys), meta.MACNonce, moved).AsTag()
		}
		if meta.MAC != want {
			t.Fatalf("bucket %d: MAC %v, the bytes moved have %v", m.Seq, meta.MAC, want)
		}
		buckets++
	}
	if commits != 3 || buckets != len(rec.bytes) || buckets < 6 {
		t.Fatalf("%d commit messages and %d signed buckets of %d moved", commits, buckets, len(rec.bytes))
	}
}

// forgingEndpoint changes, on a receiver, the first bytes of bucket target
// once they landed, keeping the bucket's checksum (checksumtest.Forge), as
// a relay on the byte transport's path can: forge does it to the buffer.
type forgingEndpoint struct {
	transport.Endpoint
	forge  func(ctx context.Context, buf mem.Buffer, n int) error
	target atomic.Uint64 // the bucket's seq + 1; 0: none
	last   atomic.Uint64 // the last bucket seen
	forged atomic.Bool
}

func (f *forgingEndpoint) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	if err := f.Endpoint.Broadcast(ctx, seq, buf, n); err != nil {
		return err
	}
	f.last.Store(seq)
	if seq+1 != f.target.Load() {
		return nil
	}
	if n < checksumtest.ForgedLen {
		return fmt.Errorf("bucket %d of %d bytes is too short to forge", seq, n)
	}
	f.forged.Store(true)
	return f.forge(ctx, buf, n)
}

// forgeHost forges a host bucket.
func forgeHost(ctx context.Context, buf mem.Buffer, n int) error {
	b := buf.Host()[:n]
	sum := checksum.Sum(b)
	checksumtest.Forge(b, 0)
	if checksum.Sum(b) != sum {
		return errors.New("the forgery changed the checksum")
	}
	return nil
}

// TestMACCatchesForgery: a relay on rank 1's byte transport changes the
// first bucket of round 2 and fixes its checksum. Without a secret the
// forged version is committed (the checksum is fooled: it catches
// accidents, not attackers); with one, the round fails on rank 1 with a
// MAC mismatch naming the bucket, no rank commits version 2, and every
// receiver still holds version 1, rank 1's in-place model too, since the
// check comes before any sink sees the bucket.
func TestMACCatchesForgery(t *testing.T) {
	for _, c := range []struct {
		name string
		kind mac.Kind // "": no secret
	}{{"no secret", ""}, {"secret", mac.BLAKE3}, {"secret, Poly1305-AES", mac.Poly1305AES}} {
		secret := c.kind != ""
		t.Run(c.name, func(t *testing.T) {
			var keys *auth.Keys
			if secret {
				keys = testKeys(t, "r1")
			}
			fe := &forgingEndpoint{forge: forgeHost}
			g := newGroup(t, groupOpts{world: 3, bucket: 64 << 10, checksum: true, auth: keys, mac: c.kind,
				wrapEP: func(r int, ep transport.Endpoint) transport.Endpoint {
					if r != 1 {
						return ep
					}
					fe.Endpoint = ep
					return fe
				}})
			models := []*memModel{newMemModel(), newShadowModel()}
			sinks := []Sink{models[0], models[1]}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := g.round(ctx, roundModel(t, 1), 1, sinks); err != nil {
				t.Fatal(err)
			}
			target := fe.last.Load() + 2 // past round 1's commit message
			fe.target.Store(target + 1)
			err := roundCancel(ctx, g, roundModel(t, 2), 2, sinks) // inproc's root would wait for the receivers that left
			if !fe.forged.Load() {
				t.Fatalf("bucket %d was never forged (round: %v)", target, err)
			}
			if !secret {
				if err != nil {
					t.Fatalf("without a secret the forged round failed: %v", err)
				}
				if sameAs(models[0], roundModel(t, 2)) == nil {
					t.Fatal("the forgery did not reach rank 1's model")
				}
				return
			}
			if err == nil {
				t.Fatal("a forged bucket was committed")
			}
			want := fmt.Sprintf("bucket %d (version 2, ", target)
			if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "failed its MAC") || !errors.Is(err, auth.ErrFailed) {
				t.Fatalf("the round failed with %v; want a MAC mismatch naming %q", err, want)
			}
			t.Logf("expected: %v", err)
			if c := g.sender.Committed(); c != 1 {
				t.Errorf("the root committed version %d", c)
			}
			for i, r := range g.receivers {
				if r.Committed() != 1 || r.State() != StateIntact {
					t.Errorf("receiver %d: committed %d, state %v; want version 1 intact", i+1, r.Committed(), r.State())
				}
				if err := sameAs(models[i], roundModel(t, 1)); err != nil {
					t.Errorf("receiver %d no longer holds version 1: %v", i+1, err)
				}
			}
		})
	}
}

// TestSignedMessagesRejected: a receiver with the run's keys refuses
// metadata and commit messages that are unsigned, signed with another
// run's keys, changed after signing or replayed at another sequence
// number, and a bucket without a MAC; one without keys refuses signed
// messages. Each error names the bucket or the version.
func TestSignedMessagesRejected(t *testing.T) {
	keys, other := testKeys(t, "r1"), testKeys(t, "r2")
	meta := wire.BucketMeta{Seq: 0, Version: 1, Length: 20, IsLast: true, MAC: mac.Tag{1}, HasMAC: true,
		Entries: []wire.Entry{{Name: "w", DType: dtype.F32, Shape: []int64{5}, Size: 20, Total: 20}}}
	enc, err := wire.EncodeMeta(&meta)
	if err != nil {
		t.Fatal(err)
	}
	signed := wire.Seal(keys, 0, enc)
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(signed, &obj); err != nil || string(obj["bucket_mac"]) != `"`+meta.MAC.String()+`"` {
		t.Fatalf("the signed metadata %s is not JSON with the bucket MAC (%v)", signed, err)
	}
	// An older reader ignores the signature; the body is what was signed.
	if back, err := wire.DecodeMeta(signed); err != nil || back.MAC != meta.MAC {
		t.Fatalf("DecodeMeta of signed metadata: %+v, %v", back, err)
	}
	if body, err := wire.Open(keys, 0, signed); err != nil || !bytes.Equal(body, enc) {
		t.Fatalf("wire.Open: %q, %v", body, err)
	}

	renamed := bytes.Replace(signed, []byte(`"name":"w"`), []byte(`"name":"x"`), 1)
	unsignedMAC := meta
	unsignedMAC.HasMAC = false
	noMAC, _ := wire.EncodeMeta(&unsignedMAC)
	pool, err := NewPool(mem.Host{}, 2, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	subscribe := func(keys *auth.Keys, msg transport.Message) ([]*Bucket, error) {
		p := pipeline.New("subscribe")
		var got []*Bucket
		collect(p, Subscribe(p, &scriptedSubscriber{msgs: []transport.Message{msg}}, pool, 0, keys), func(b *Bucket) { got = append(got, b) })
		return got, p.Run(context.Background())
	}
	for name, c := range map[string]struct {
		keys *auth.Keys
		msg  transport.Message
		want string
	}{
		"unsigned":         {keys, transport.Message{Seq: 0, Data: enc}, "is not signed"},
		"another run":      {keys, transport.Message{Seq: 0, Data: wire.Seal(other, 0, enc)}, "does not verify"},
		"renamed entry":    {keys, transport.Message{Seq: 0, Data: renamed}, "does not verify"},
		"replayed":         {keys, transport.Message{Seq: 7, Data: signed}, "does not verify"},
		"no secret here":   {nil, transport.Message{Seq: 0, Data: signed}, "this rank has none"},
		"truncated sealed": {keys, transport.Message{Seq: 0, Data: signed[:len(signed)-3]}, "is not signed"},
	} {
		_, err := subscribe(c.keys, c.msg)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, auth.ErrFailed) || !strings.Contains(err.Error(), fmt.Sprintf("bucket %d", c.msg.Seq)) {
			t.Errorf("%s: %v; want an authentication failure naming the bucket, saying %q", name, err, c.want)
		}
	}
	got, err := subscribe(keys, transport.Message{Seq: 0, Data: signed})
	if err != nil || len(got) != 1 || got[0].auth != keys {
		t.Fatalf("good signed metadata: %d buckets, %v", len(got), err)
	}

	// Signed metadata without a bucket MAC passes the bus and fails in
	// unpack, before any view is made.
	got, err = subscribe(keys, transport.Message{Seq: 0, Data: wire.Seal(keys, 0, noMAC)})
	if err != nil || len(got) != 1 {
		t.Fatalf("signed metadata without a bucket MAC: %v", err)
	}
	hb, _ := mem.Host{}.Alloc(4096)
	buf := hb.Host()
	b := &Bucket{Meta: got[0].Meta, Buf: hb, auth: keys}
	if _, err := newBucketCheck(nil).unpack(context.Background(), b); err == nil || !strings.Contains(err.Error(), "bucket 0 (version 1) carries no MAC") {
		t.Fatalf("a bucket without a MAC: %v", err)
	}
	b.Meta.MAC, b.Meta.HasMAC = mac.Sum(bucketKey(keys), buf[:20]), true
	if u, err := newBucketCheck(nil).unpack(context.Background(), b); err != nil || len(u.Views) != 1 {
		t.Fatalf("a bucket with its MAC: %v", err)
	}

	// The commit message, signed as docs/protocol.md writes it.
	ctx := context.Background()
	commit := wire.EncodeCommit(2)
	tag := keys.MessageMAC(5, []byte(`{"commit":2}`))
	if got, want := string(wire.Seal(keys, 5, commit)), `{"commit":2,"mac":"`+hex.EncodeToString(tag[:])+`"}`; got != want {
		t.Fatalf("signed commit message %s, want %s", got, want)
	}
	if _, err := wire.DecodeCommit(wire.Seal(keys, 5, commit)); err == nil {
		t.Fatal("DecodeCommit took a signed commit message: older readers would take it unchecked")
	}
	for name, c := range map[string]struct {
		keys *auth.Keys
		msg  transport.Message
		want string
	}{
		"unsigned":       {keys, transport.Message{Seq: 5, Data: commit}, "is not signed"},
		"another run":    {keys, transport.Message{Seq: 5, Data: wire.Seal(other, 5, commit)}, "does not verify"},
		"replayed":       {keys, transport.Message{Seq: 5, Data: wire.Seal(keys, 4, commit)}, "does not verify"},
		"no secret here": {nil, transport.Message{Seq: 5, Data: wire.Seal(keys, 5, commit)}, "this rank has none"},
	} {
		sub := &scriptedSubscriber{msgs: []transport.Message{c.msg}}
		err := AwaitCommit(ctx, sub, 5, 2, c.keys)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "commit message of version 2") || len(sub.acked) != 0 {
			t.Errorf("%s: %v (acked %v)", name, err, sub.acked)
		}
	}
	sub := &scriptedSubscriber{msgs: []transport.Message{{Seq: 5, Data: wire.Seal(keys, 5, commit)}}}
	if err := AwaitCommit(ctx, sub, 5, 2, keys); err != nil || len(sub.acked) != 1 {
		t.Fatalf("a signed commit: %v, acked %v", err, sub.acked)
	}
}

// TestSecretMismatch: a root with a secret and a receiver without one, or
// the other way round, fail their first round saying so, and commit
// nothing.
func TestSecretMismatch(t *testing.T) {
	keys := testKeys(t, "r1")
	for name, c := range map[string]struct {
		root, recv *auth.Keys
		want       string
	}{
		"receiver without": {keys, nil, "this rank has none"},
		"root without":     {nil, keys, "is not signed"},
	} {
		t.Run(name, func(t *testing.T) {
			g := newGroup(t, groupOpts{world: 2, bucket: 64 << 10, checksum: true, auth: c.root})
			g.receivers[0].cfg.Auth = c.recv
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := roundCancel(ctx, g, roundModel(t, 1), 1, []Sink{newMemModel()})
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, auth.ErrFailed) {
				t.Fatalf("%v; want authentication failed, %q", err, c.want)
			}
			if g.sender.Committed() != 0 || g.receivers[0].Committed() != 0 {
				t.Fatal("a version was committed")
			}
		})
	}
}
