package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/layout"
)

// routedSmall is a small synthetic model for routed runs: 24 tensors of
// 8 MiB in all, whose rows divide by 4.
var routedSmall = []string{"--size", "8MiB", "--tensors", "24", "--bucket", "1MiB", "--rounds", "2", "--timeout", "60s"}

// shardBytes is what receiver index i takes of the synthetic model at
// tp, by the default rules, with a head per TP rank (as the demo sets).
func shardBytes(t *testing.T, c *config, i, tp int) int64 {
	t.Helper()
	m, err := c.model(1)
	if err != nil {
		t.Fatal(err)
	}
	var user []layout.Rule
	for _, s := range syntheticRules {
		r, err := layout.ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		user = append(user, r)
	}
	rules, err := layout.DefaultRules().With(user...)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, tn := range m.List() {
		lt := layout.Tensor{Name: tn.Name, DType: tn.DType, Shape: tn.Shape}
		if tp == 1 {
			n += lt.Bytes()
			continue
		}
		k, err := rules.Kind(tn.Name)
		if err != nil {
			t.Fatal(err)
		}
		s, ok, err := k.Need(lt, layout.Coord{TPRank: i % tp, TPSize: tp, EPSize: 1}, layout.Model{Heads: tp, KVHeads: tp})
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			n += s.Elements() * int64(tn.DType.Size())
		}
	}
	return n
}

// TestRoutedProcesses runs S senders and 4 receivers as processes over
// tcp, at TP 1, 2 and 4, and S = 1 for comparison: every receiver
// verifies its shard against the model's slice every round and takes
// exactly its shard's bytes, so TP 4 takes about a quarter of TP 1; no
// sender sends more than its share plus one bucket.
func TestRoutedProcesses(t *testing.T) {
	for _, c := range []struct{ senders, tp int }{{4, 1}, {4, 2}, {4, 4}, {1, 4}} {
		t.Run(fmt.Sprintf("S%d_TP%d", c.senders, c.tp), func(t *testing.T) {
			etcd := startEtcd(t)
			world := c.senders + 4
			args := append([]string{"--senders", fmt.Sprint(c.senders), "--tp", fmt.Sprint(c.tp), "--verify"}, routedSmall...)
			ps := startAll(t, etcd, fmt.Sprintf("routed-%d-%d", c.senders, c.tp), "r1", world, args...)
			cfg, err := parseConfig(append([]string{"--ranks", fmt.Sprint(world)}, args...), func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			var needed int64
			received := make([]int64, 4)
			var plan string
			for _, p := range ps {
				if err := p.wait(t, 90*time.Second); err != nil {
					t.Fatalf("rank %d: %v\n%s", p.rank, err, p.err.String())
				}
				r := p.summary(t).PerRank[0]
				if len(r.Rounds) != 2 || r.Error != "" || r.CommittedVersion != 2 {
					t.Fatalf("rank %d: %+v", p.rank, r)
				}
				if plan == "" {
					plan = r.Plan
				} else if r.Plan != plan {
					t.Fatalf("rank %d planned %s, rank 0 %s", p.rank, r.Plan, plan)
				}
				if p.rank >= c.senders {
					i := p.rank - c.senders
					want := shardBytes(t, cfg, i, c.tp)
					if !r.Verified || r.Rounds[1].BytesReceived != want {
						t.Fatalf("receiver %d: verified %v, took %d bytes, its shard is %d", i, r.Verified, r.Rounds[1].BytesReceived, want)
					}
					received[i], needed = want, needed+want
				}
			}
			for _, p := range ps[:c.senders] {
				r := p.summary(t).PerRank[0]
				if limit := needed/int64(c.senders) + cfg.bucket; r.Rounds[1].BytesSent > limit {
					t.Errorf("sender %d sent %d bytes, more than its share plus a bucket (%d)", p.rank, r.Rounds[1].BytesSent, limit)
				}
			}
			t.Logf("S=%d TP=%d: receiver 0 took %d bytes", c.senders, c.tp, received[0])
		})
	}
}

// TestRoutedSenderKilled kills sender 2 of 4 with SIGKILL mid-round: every
// other rank fails within seconds naming rank 2, and no receiver commits
// a version the others lack.
func TestRoutedSenderKilled(t *testing.T) {
	etcd := startEtcd(t)
	ps := startAll(t, etcd, "routed-kill", "r1", 8, "--senders", "4", "--tp", "2", "--size", "64MiB", "--tensors", "30", "--bucket", "1MiB", "--rounds", "1000", "--timeout", "60s")
	time.Sleep(3 * time.Second)
	for _, p := range ps {
		select {
		case <-p.done:
			t.Fatalf("rank %d ended before the kill: %v\n%s", p.rank, p.exit, p.err.String())
		default:
		}
	}
	killed := time.Now()
	if err := ps[2].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var committed []uint64
	for _, p := range ps {
		if p.rank == 2 {
			continue
		}
		if err := p.wait(t, 30*time.Second); err == nil {
			t.Fatalf("rank %d exited 0 after sender 2 was killed", p.rank)
		}
		if d := p.exited.Sub(killed); d > 15*time.Second {
			t.Errorf("rank %d took %v to fail", p.rank, d)
		}
		r := p.summary(t).PerRank[0]
		if !strings.Contains(r.Error, "rank 2") {
			t.Errorf("rank %d's error does not name rank 2: %s", p.rank, r.Error)
		}
		if p.rank >= 4 {
			committed = append(committed, r.CommittedVersion)
		}
		t.Logf("rank %d exited %.1fs after the kill: %s", p.rank, p.exited.Sub(killed).Seconds(), r.Error)
	}
	for _, v := range committed[1:] {
		if v != committed[0] {
			t.Fatalf("the receivers committed different versions: %v", committed)
		}
	}
}
