package rendezvous_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/auth/authtest"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/rendezvoustest"
)

// withSecret gives every rank of specs the run keys of secret.
func withSecret(t *testing.T, specs []rankSpec, secret *auth.Secret) []rankSpec {
	for i := range specs {
		o := &specs[i].opts
		o.Auth = authtest.Keys(t, secret, o.Group, o.RunID)
	}
	return specs
}

// stranger is a process on the same etcd with no secret, which writes and
// deletes keys directly.
type stranger struct {
	put func(key, value string)
	del func(key string)
	get func(key string) ([]byte, bool)
}

// backend is an etcd or a Mem and the stranger that tampers with it.
type backend struct {
	name string
	open func() rendezvous.Store
	s    stranger
}

func backends(t *testing.T) []backend {
	e := startEmbedded(t)
	raw := dial(t, []string{e.ClientURL()}, 5*time.Second)
	m := rendezvoustest.NewMem()
	rawMem := m.NewStore()
	t.Cleanup(func() { rawMem.Close() })
	ctx := t.Context()
	get := func(s rendezvous.Store) func(string) ([]byte, bool) {
		return func(k string) ([]byte, bool) {
			v, ok, err := s.Get(ctx, k)
			if err != nil {
				t.Error(err)
			}
			return v, ok
		}
	}
	return []backend{
		{"etcd", etcdOpener(t, e, 5*time.Second), stranger{
			put: func(k, v string) {
				if err := rendezvous.Put(ctx, raw, k, v); err != nil {
					t.Error(err)
				}
			},
			del: func(k string) {
				if err := raw.DeletePrefix(ctx, k); err != nil {
					t.Error(err)
				}
			},
			get: get(raw),
		}},
		{"mem", func() rendezvous.Store { return m.NewStore() }, stranger{
			put: func(k, v string) { m.Put(k, []byte(v)) },
			del: m.Delete,
			get: get(rawMem),
		}},
	}
}

// joinAll fails the test unless every rank joined, and closes the groups
// when it ends, the receivers first (rank 0's Close waits for them).
func joinAll(t *testing.T, res []joinResult) {
	t.Helper()
	for r, x := range res {
		if x.err != nil {
			t.Fatalf("rank %d: %v", r, x.err)
		}
	}
	t.Cleanup(func() {
		for i := len(res) - 1; i >= 0; i-- {
			res[i].g.Close()
		}
	})
}

// TestJoinWithSecret forms a run whose ranks share a secret: every record
// in the store is signed, and the Group's exchange works as without one.
func TestJoinWithSecret(t *testing.T) {
	t.Parallel()
	secret := authtest.Secret(t)
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			const n = 4
			res := joinRanks(t, b.open, withSecret(t, world("signed", "r", n, 20*time.Second), secret))
			joinAll(t, res)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := res[2].g.Put(ctx, "tcp.addr", []byte("10.0.0.2:9")); err != nil {
				t.Fatal(err)
			}
			for _, x := range res {
				if v, err := x.g.Get(ctx, 2, "tcp.addr"); err != nil || string(v) != "10.0.0.2:9" {
					t.Fatalf("Get of rank 2's address = %q, %v", v, err)
				}
				if x.g.UniqueID() != res[0].g.UniqueID() {
					t.Fatal("ranks see different unique ids")
				}
			}
			for _, key := range []string{"/weightcast/signed/r/root", "/weightcast/signed/r/ranks/1", "/weightcast/signed/r/data/2/tcp.addr", "/weightcast/signed/r/seen/3", "/weightcast/signed/r/join/0"} {
				v, ok := b.s.get(key)
				if !ok || !bytes.Contains(v, []byte("\nwcmac1:")) {
					t.Errorf("key %s holds %q; want a signed record", key, v)
				}
			}
		})
	}
}

// TestJoinDifferentSecrets starts ranks with different secrets, or one
// without: every rank fails within the join deadline with "authentication
// failed", never a timeout or another cause.
func TestJoinDifferentSecrets(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	const timeout = 2 * time.Second
	a, b := authtest.Secret(t), authtest.Secret(t)
	for name, secrets := range map[string][]*auth.Secret{
		"rank 1 another secret": {a, b, a},
		"rank 0 another secret": {b, a, a},
		"rank 2 none":           {a, a, nil},
		"rank 0 none":           {nil, a, a},
	} {
		t.Run(name, func(t *testing.T) {
			specs := world("secrets", strings.ReplaceAll(name, " ", "-"), 3, timeout)
			for i, s := range secrets {
				if s != nil {
					withSecret(t, specs[i:i+1], s)
				}
			}
			res := joinRanks(t, etcdOpener(t, e, 5*time.Second), specs)
			for r, x := range res {
				if x.err == nil {
					t.Fatalf("rank %d joined", r)
				}
				if !errors.Is(x.err, rendezvous.ErrAuth) || !errors.Is(x.err, auth.ErrFailed) || !strings.Contains(x.err.Error(), "authentication failed") {
					t.Errorf("rank %d: %v; want authentication failed", r, x.err)
				}
				if errors.Is(x.err, rendezvous.ErrTimeout) {
					t.Errorf("rank %d: %v also matches ErrTimeout", r, x.err)
				}
				if x.took > timeout+5*time.Second {
					t.Errorf("rank %d failed after %v, the join deadline is %v", r, x.took, timeout)
				}
			}
			t.Logf("rank 0: %v", res[0].err)
			t.Logf("rank 1: %v", res[1].err)
		})
	}
}

// TestStrangerSquatsRecords has a process without the secret write rank
// 2's record, rank 0's root record, an abort record and rank 1's data key
// before the ranks do: each is refused, the ranks' own records replace
// them, and the run forms and exchanges the real values.
func TestStrangerSquatsRecords(t *testing.T) {
	t.Parallel()
	secret := authtest.Secret(t)
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			p := "/weightcast/squat/r/"
			b.s.put(p+"ranks/2", `{"world_size":3,"endpoints":{"meta":"6.6.6.6:1"}}`)
			b.s.put(p+"root", `{"world_size":3,"unique_id":"`+strings.Repeat("A", 172)+`"}`)
			b.s.put(p+"abort", `{"kind":"peer-gone","by":1,"detail":"forged"}`)
			b.s.put(p+"data/1/tcp.addr", "6.6.6.6:2")
			res := joinRanks(t, b.open, withSecret(t, world("squat", "r", 3, 20*time.Second), secret))
			joinAll(t, res)
			if v, _ := res[0].g.Endpoint(2, "meta"); v != "10.0.0.2:7002" {
				t.Fatalf("rank 2's endpoint is %q; want the real rank's", v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			got := make(chan []byte, 1)
			go func() {
				v, _ := res[2].g.Get(ctx, 1, "tcp.addr")
				got <- v
			}()
			time.Sleep(200 * time.Millisecond) // the Get waits past the stranger's value
			if err := res[1].g.Put(ctx, "tcp.addr", []byte("10.0.0.1:9")); err != nil {
				t.Fatalf("rank 1's Put over a stranger's value: %v", err)
			}
			if v := <-got; string(v) != "10.0.0.1:9" {
				t.Fatalf("rank 2 read rank 1's address as %q", v)
			}
		})
	}
}

// TestForgedRecordRefused waits for a key that only a stranger wrote: the
// wait fails with ErrAuth naming the key and its rank, not with a timeout.
// A stranger's record where a rank's record is rewritten after the join
// is reported as tampering.
func TestForgedRecordRefused(t *testing.T) {
	t.Parallel()
	secret := authtest.Secret(t)
	b := backends(t)[0]
	res := joinRanks(t, b.open, withSecret(t, world("forged", "r", 3, 1500*time.Millisecond), secret))
	joinAll(t, res)
	p := "/weightcast/forged/r/"
	other := authtest.Keys(t, authtest.Secret(t), "forged", "r")
	b.s.put(p+"data/1/tcp.addr", string(other.SignRecord(p+"data/1/tcp.addr", []byte("6.6.6.6:2"))))
	_, err := res[2].g.Get(context.Background(), 1, "tcp.addr")
	re := asError(t, err)
	if !errors.Is(err, rendezvous.ErrAuth) || errors.Is(err, rendezvous.ErrTimeout) || re.Key != p+"data/1/tcp.addr" || !slices.Equal(re.Ranks, []int{1}) {
		t.Fatalf("Get of a forged record = %v (key %q, ranks %v); want ErrAuth naming the key and rank 1", err, re.Key, re.Ranks)
	}
	t.Logf("forged record: %v", err)
}

// TestRecordTampering deletes or rewrites a rank's record, or the whole
// group, behind the ranks' backs, with and without a secret: every rank
// reports exactly that, not a lost lease or a dead rank.
func TestRecordTampering(t *testing.T) {
	t.Parallel()
	secret := authtest.Secret(t)
	for _, b := range backends(t) {
		for _, c := range []struct {
			name   string
			secret *auth.Secret
			do     func(p string)
			rank   int
			want   string
		}{
			{"delete rank 2", nil, func(p string) { b.s.del(p + "ranks/2") }, 2, "rank 2's record was deleted"},
			{"delete rank 2 signed", secret, func(p string) { b.s.del(p + "ranks/2") }, 2, "rank 2's record was deleted"},
			{"rewrite rank 1", secret, func(p string) { b.s.put(p+"ranks/1", `{"world_size":3}`) }, 1, "rank 1's record was rewritten"},
			{"delete rank 0", nil, func(p string) { b.s.del(p + "ranks/0") }, 0, "rank 0's record was deleted"},
		} {
			t.Run(b.name+"/"+c.name, func(t *testing.T) {
				run := strings.ReplaceAll(c.name, " ", "-")
				specs := world("tamper", run, 3, 20*time.Second)
				if c.secret != nil {
					withSecret(t, specs, c.secret)
				}
				res := joinRanks(t, b.open, specs)
				joinAll(t, res)
				c.do("/weightcast/tamper/" + run + "/")
				for r, x := range res {
					select {
					case <-x.g.PeerGone():
					case <-time.After(10 * time.Second):
						t.Fatalf("rank %d: the group did not break within 10s", r)
					}
					err := x.g.Err()
					re := asError(t, err)
					want := c.want
					if r == c.rank {
						want = "this rank's own record was"
					}
					if !errors.Is(err, rendezvous.ErrTampered) || errors.Is(err, rendezvous.ErrPeerGone) || !slices.Equal(re.Ranks, []int{c.rank}) || !strings.Contains(err.Error(), want) {
						t.Errorf("rank %d: %v; want ErrTampered naming rank %d and saying %q", r, err, c.rank, want)
					}
				}
			})
		}
		t.Run(b.name+"/delete group", func(t *testing.T) {
			res := joinRanks(t, b.open, world("tamper", "all", 3, 20*time.Second))
			joinAll(t, res)
			if b.name == "mem" {
				for r := range 3 {
					b.s.del(fmt.Sprintf("/weightcast/tamper/all/ranks/%d", r))
				}
			} else {
				b.s.del("/weightcast/tamper/")
			}
			for r, x := range res {
				select {
				case <-x.g.PeerGone():
				case <-time.After(10 * time.Second):
					t.Fatalf("rank %d: the group did not break within 10s", r)
				}
				if err := x.g.Err(); !errors.Is(err, rendezvous.ErrTampered) || !strings.Contains(err.Error(), "deleted") {
					t.Errorf("rank %d after the group's keys were deleted: %v; want ErrTampered saying deleted", r, err)
				}
			}
		})
	}
}

func TestJoinKeysOfAnotherRun(t *testing.T) {
	m := rendezvoustest.NewMem()
	o := world("g", "r", 2, time.Second)[0].opts
	o.Auth = authtest.Keys(t, authtest.Secret(t), "g", "another-run")
	_, err := rendezvous.Join(context.Background(), m.NewStore(), o)
	if !errors.Is(err, rendezvous.ErrInvalid) || !strings.Contains(err.Error(), "another-run") {
		t.Fatalf("Join with the keys of another run = %v; want ErrInvalid naming it", err)
	}
}
