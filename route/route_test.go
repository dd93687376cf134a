package route

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/tcp"
	"github.com/weightcast/weightcast/transport/transporttest"
	"github.com/weightcast/weightcast/transport/zmqbus"
)

// model is a small Llama-shaped model: two layers, vocabulary 64, hidden
// 32, 4 heads of 8 with 2 key/value heads, MLP 48.
func model() []layout.Tensor {
	var ts []layout.Tensor
	add := func(name string, shape ...int64) {
		ts = append(ts, layout.Tensor{Name: name, DType: dtype.BF16, Shape: shape})
	}
	add("model.embed_tokens.weight", 64, 32)
	for l := range 2 {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", 32)
		add(p+"self_attn.q_proj.weight", 32, 32)
		add(p+"self_attn.k_proj.weight", 16, 32)
		add(p+"self_attn.v_proj.weight", 16, 32)
		add(p+"self_attn.o_proj.weight", 32, 32)
		add(p+"post_attention_layernorm.weight", 32)
		add(p+"mlp.gate_proj.weight", 48, 32)
		add(p+"mlp.up_proj.weight", 48, 32)
		add(p+"mlp.down_proj.weight", 32, 48)
	}
	add("model.norm.weight", 32)
	add("lm_head.weight", 64, 32)
	return ts
}

// llama is model's head counts.
var llama = layout.Model{Heads: 4, KVHeads: 2}

// full returns tensor t's global bytes in round version.
func full(t layout.Tensor, version uint64) []byte {
	b := make([]byte, t.Bytes())
	x := uint32(version*2654435761) ^ uint32(len(t.Name)*40503)
	for _, c := range t.Name {
		x = x*31 + uint32(c)
	}
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// group is an open routed group in this process: tcp pairs and the zmq
// bus, as processes use them.
type group struct {
	senders []*Sender
	recv    []*Receiver
	pairs   []transport.Pairs
}

func openGroup(t *testing.T, ctx context.Context, senders, receivers, bucket int, needs []Need, mutate func(*Config)) *group {
	t.Helper()
	return openGroupOn(t, ctx, tcp.OpenPairs, mem.Host{}, nil, senders, receivers, bucket, needs, mutate)
}

// openGroupOn opens a group whose pairs open and whose buffers are on dev,
// with the run's keys when keys is set.
func openGroupOn(t *testing.T, ctx context.Context, open transport.PairsOpener, dev mem.Device, keys func(group string) *auth.Keys,
	senders, receivers, bucket int, needs []Need, mutate func(*Config)) *group {
	t.Helper()
	world := senders + receivers
	cfgs := transporttest.Configs(fmt.Sprintf("route-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano()), world, 20*time.Second)
	for r := range cfgs {
		cfgs[r].Senders, cfgs[r].Device = senders, dev
		if keys != nil {
			cfgs[r].Auth = keys(cfgs[r].Group)
		}
	}
	pub, subs := transporttest.OpenBus(t, ctx, transporttest.MetaOpeners{Publisher: zmqbus.OpenPublisher, Subscriber: zmqbus.OpenSubscriber}, cfgs)
	g := &group{pairs: make([]transport.Pairs, world)}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range cfgs {
		wg.Go(func() { g.pairs[r], errs[r] = open(ctx, cfgs[r]) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, p := range g.pairs {
			p.Close()
		}
	})
	for r, c := range cfgs {
		rc := Config{Group: c.Group, Rank: r, Senders: senders, WorldSize: world, Pairs: g.pairs[r], Exchange: c.Exchange,
			Device: dev, BucketSize: bucket, Checksum: true, Auth: c.Auth, Timeout: 20 * time.Second}
		if r == 0 {
			rc.Publisher = pub
		} else {
			rc.Subscriber = subs[r-1]
		}
		if mutate != nil {
			mutate(&rc)
		}
		if r < senders {
			s, err := NewSender(rc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			g.senders = append(g.senders, s)
		} else {
			rcv, err := NewReceiver(rc, needs[r-senders])
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rcv.Close() })
			g.recv = append(g.recv, rcv)
		}
	}
	return g
}

// fsdp returns sender i of n's dim-0 chunks of every tensor of round
// version.
func fsdp(ts []layout.Tensor, i, n int, version uint64) []Local {
	var out []Local
	for _, t := range ts {
		s, ok := layout.ChunkDim0(layout.Full(t.Shape), i, n)
		if !ok {
			continue
		}
		out = append(out, Local{Shard: Shard{Name: t.Name, DType: t.DType, Shape: t.Shape, Offset: s.Offset, Size: s.Size}, Data: Region(t, s, full(t, version))})
	}
	return out
}

// round runs one round on every rank; shards[i] is sender i's.
func (g *group) round(ctx context.Context, version uint64, shards [][]Local, dests []Dest) ([]Stats, []error) {
	n := len(g.senders) + len(g.recv)
	stats, errs := make([]Stats, n), make([]error, n)
	var wg sync.WaitGroup
	for i, s := range g.senders {
		wg.Go(func() { stats[i], errs[i] = s.Sync(ctx, version, shards[i]) })
	}
	for i, r := range g.recv {
		k := len(g.senders) + i
		wg.Go(func() { stats[k], errs[k] = r.Sync(ctx, dests[i]) })
	}
	wg.Wait()
	return stats, errs
}

// TestRoutedTP routes a dim-0 sharded model from S senders to 4 receivers
// at TP 1, 2 and 4 over tcp: every receiver holds exactly its TP shard of
// the round's weights, takes exactly its shard's bytes, and no sender
// sends more than its share plus a bucket.
func TestRoutedTP(t *testing.T) {
	ts := model()
	var total int64
	for _, tn := range ts {
		total += tn.Bytes()
	}
	for _, c := range []struct{ senders, tp int }{{4, 1}, {4, 2}, {4, 4}, {1, 4}} {
		t.Run(fmt.Sprintf("S%d_TP%d", c.senders, c.tp), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const bucket = 3000
			needs := make([]Need, 4)
			for i := range needs {
				needs[i] = Need{TP: c.tp, TPRank: i % c.tp, Model: llama}
			}
			g := openGroup(t, ctx, c.senders, 4, bucket, needs, nil)
			dests := make([]*Shards, 4)
			ds := make([]Dest, 4)
			for i := range dests {
				dests[i] = &Shards{}
				ds[i] = dests[i]
			}
			for v := uint64(1); v <= 2; v++ {
				shards := make([][]Local, c.senders)
				for i := range shards {
					shards[i] = fsdp(ts, i, c.senders, v)
				}
				stats, errs := g.round(ctx, v, shards, ds)
				for r, err := range errs {
					if err != nil {
						t.Fatalf("version %d rank %d: %v", v, r, err)
					}
				}
				var needed int64 // every receiver's shard, together
				for i, d := range dests {
					var want int64
					for _, tn := range ts {
						k, _ := layout.DefaultRules().Kind(tn.Name)
						s, ok, err := k.Need(tn, layout.Coord{TPRank: i % c.tp, TPSize: c.tp, EPSize: 1}, llama)
						if err != nil {
							t.Fatal(err)
						}
						if !ok {
							continue
						}
						want += s.Elements() * 2
						got, found := d.Get(tn.Name)
						switch {
						case !found:
							t.Fatalf("receiver %d lacks %s", i, tn.Name)
						case !got.Slice.Equal(s):
							t.Fatalf("receiver %d holds %s %v, its TP shard is %v", i, tn.Name, got.Slice, s)
						case !bytes.Equal(got.Data, Region(tn, s, full(tn, v))):
							t.Fatalf("version %d receiver %d: %s %v differs from the reference slice", v, i, tn.Name, s)
						}
					}
					needed += want
					if got := stats[c.senders+i].BytesReceived; got != want {
						t.Errorf("receiver %d took %d bytes, its shard is %d", i, got, want)
					}
					if d.Version() != v {
						t.Errorf("receiver %d committed %d, want %d", i, d.Version(), v)
					}
				}
				var sent int64
				for i := range c.senders {
					sent += stats[i].BytesSent
					if limit := needed/int64(c.senders) + bucket; stats[i].BytesSent > limit {
						t.Errorf("sender %d sent %d bytes, more than its share plus a bucket (%d)", i, stats[i].BytesSent, limit)
					}
				}
				if sent != needed {
					t.Errorf("the senders sent %d bytes, the receivers need %d", sent, needed)
				}
				if c.tp == 1 && needed != 4*total {
					t.Errorf("4 receivers at TP 1 took %d bytes, the model is %d", needed, total)
				}
				if stats[0].Replanned != (v == 1) {
					t.Errorf("version %d: replanned %v", v, stats[0].Replanned)
				}
			}
		})
	}
}

// TestRelayout changes a sender's layout between rounds: every rank plans
// again, and the bytes still arrive whole.
func TestRelayout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ts := model()
	g := openGroup(t, ctx, 2, 2, 1<<12, []Need{{}, {TP: 2, TPRank: 1, Model: llama}}, nil)
	d := []*Shards{{}, {}}
	ds := []Dest{d[0], d[1]}
	rounds := []struct {
		shards    func(v uint64) [][]Local
		replanned bool
	}{
		{func(v uint64) [][]Local { return [][]Local{fsdp(ts, 0, 2, v), fsdp(ts, 1, 2, v)} }, true},
		{func(v uint64) [][]Local { return [][]Local{fsdp(ts, 0, 2, v), fsdp(ts, 1, 2, v)} }, false},
		{func(v uint64) [][]Local { return [][]Local{fsdp(ts, 0, 1, v), fsdp(ts, 1, 2, v)} }, true}, // sender 0 holds everything
	}
	for i, r := range rounds {
		v := uint64(i + 1)
		stats, errs := g.round(ctx, v, r.shards(v), ds)
		for k, err := range errs {
			if err != nil {
				t.Fatalf("round %d rank %d: %v", v, k, err)
			}
		}
		for k, s := range stats {
			if s.Replanned != r.replanned {
				t.Errorf("round %d rank %d: replanned %v, want %v", v, k, s.Replanned, r.replanned)
			}
			if s.Plan != stats[0].Plan {
				t.Errorf("round %d: rank %d's plan %s differs from rank 0's %s", v, k, s.Plan[:12], stats[0].Plan[:12])
			}
		}
		whole, _ := d[0].Get("lm_head.weight")
		if tn := ts[len(ts)-1]; !bytes.Equal(whole.Data, full(tn, v)) {
			t.Fatalf("round %d: receiver 0's lm_head differs", v)
		}
	}
}

// flipPairs changes one byte of the n-th bucket a sender sends.
type flipPairs struct {
	transport.Pairs
	mu   sync.Mutex
	left int
}

func (f *flipPairs) Send(ctx context.Context, to int, seq uint64, buf mem.Buffer, n int) error {
	f.mu.Lock()
	f.left--
	flip := f.left == 0
	f.mu.Unlock()
	if flip {
		buf.Host()[n/3] ^= 0x40
	}
	return f.Pairs.Send(ctx, to, seq, buf, n)
}

// TestCorruptByte: a byte changed on the way fails the round on every
// rank, naming the tensors of the bucket on the receiver that saw it;
// nothing is committed and the last version stays whole.
func TestCorruptByte(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ts := model()
	var flip *flipPairs
	g := openGroup(t, ctx, 2, 2, 1<<12, []Need{{}, {}}, func(c *Config) {
		if c.Rank == 1 {
			flip = &flipPairs{Pairs: c.Pairs, left: 1 << 30}
			c.Pairs = flip
		}
	})
	d := []*Shards{{}, {}}
	ds := []Dest{d[0], d[1]}
	_, errs := g.round(ctx, 1, [][]Local{fsdp(ts, 0, 2, 1), fsdp(ts, 1, 2, 1)}, ds)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	flip.mu.Lock()
	flip.left = 3
	flip.mu.Unlock()
	_, errs = g.round(ctx, 2, [][]Local{fsdp(ts, 0, 2, 2), fsdp(ts, 1, 2, 2)}, ds)
	corrupt := 0
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: a round with a changed byte succeeded", r)
		}
		if errors.Is(err, ErrCorrupt) {
			corrupt++
		}
	}
	if corrupt == 0 {
		t.Fatalf("no rank failed with ErrCorrupt: %v", errors.Join(errs...))
	}
	for i, dd := range d {
		if dd.Version() != 1 {
			t.Fatalf("receiver %d holds version %d after a failed round 2", i, dd.Version())
		}
		got, _ := dd.Get("lm_head.weight")
		if !bytes.Equal(got.Data, full(ts[len(ts)-1], 1)) {
			t.Fatalf("receiver %d: version 1 changed by the failed round", i)
		}
	}
	if _, err := g.senders[0].Sync(ctx, 3, fsdp(ts, 0, 2, 3)); !errors.Is(err, ErrBroken) {
		t.Fatalf("a sender after a failed round: %v, want ErrBroken", err)
	}
}
