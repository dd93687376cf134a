package route

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
)

// Local is one shard a sender holds, with its bytes: the local tensor,
// contiguous, row-major, Shard.Bytes() long, in host memory (Data) or in
// Buffer (device memory of the rank's GPU when its buckets are on one:
// a gpu.CUDADevice View of a tensor allocated elsewhere, say).
type Local struct {
	Shard
	Data   []byte
	Buffer mem.Buffer
}

// bytes returns the local tensor's memory as a buffer.
func (l Local) buffer() mem.Buffer {
	if l.Buffer != nil {
		return l.Buffer
	}
	return hostBytes(l.Data)
}

// Sender is one sending rank of a routed group. A failed round leaves it
// broken, as with stages.Sender.
type Sender struct{ m *member }

// NewSender returns a sending rank (cfg.Rank below cfg.Senders); it
// starts and allocates nothing.
func NewSender(cfg Config) (*Sender, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Rank >= cfg.Senders {
		return nil, fmt.Errorf("route: rank %d is a receiver (ranks [0, %d) send): use NewReceiver", cfg.Rank, cfg.Senders)
	}
	return &Sender{newMember(cfg)}, nil
}

// Sync sends one round of model version version from the shards this rank
// holds: every byte of them some receiver needs, on the plan, once every
// rank has begun the round. The shards may change from round to round
// (the plan is made again on every rank); their bytes must stay unchanged
// until Sync returns. It returns once every receiver has committed
// version.
func (s *Sender) Sync(ctx context.Context, version uint64, shards []Local) (Stats, error) {
	if version == 0 {
		return Stats{}, fmt.Errorf("route: version 0 is not a version; give every round a version above 0")
	}
	decl := make([]Shard, len(shards))
	for i, l := range shards {
		decl[i] = l.Shard
		if n := l.buffer().Len(); int64(n) < l.Bytes() || l.Buffer == nil && int64(n) != l.Bytes() {
			return Stats{}, fmt.Errorf("route: shard %s %v holds %d bytes where %v %v takes %d", l.Name, l.Slice(), n, l.DType, l.Slice().Size, l.Bytes())
		}
	}
	if err := checkShards(decl); err != nil {
		return Stats{}, fmt.Errorf("route: %w", err)
	}
	return s.m.run(ctx, version, declareShards(decl), func(ctx context.Context, sc *Schedule, v uint64) (*pipeline.Pipeline, error) {
		return s.send(ctx, sc, v, shards)
	}, nil)
}

// send runs the rank's part: per receiver, pack ──► send.
func (s *Sender) send(ctx context.Context, sc *Schedule, version uint64, shards []Local) (*pipeline.Pipeline, error) {
	m := s.m
	p := pipeline.New(fmt.Sprintf("route send v%d", version), tracing(m.cfg)...)
	byKey := make(map[string]mem.Buffer, len(shards)) // once per round, not per stream and tensor
	for _, l := range shards {
		byKey[shardKey(l.Name, l.Slice())] = l.buffer()
	}
	for _, st := range sc.Streams {
		data, err := heldData(sc, st, byKey)
		if err != nil {
			return nil, err
		}
		pool, err := m.pool(st.Receiver)
		if err != nil {
			return nil, err
		}
		eng, err := m.engine(fmt.Sprintf("pack →%d", st.Receiver))
		if err != nil {
			return nil, err
		}
		to, first := st.Receiver, m.next[st.Receiver]
		packed := pipeline.Source(p, fmt.Sprintf("pack →%d", to), 1, func(ctx context.Context, out *pipeline.Output[*item]) error {
			for i := range st.Buckets {
				b := &st.Buckets[i]
				buf, err := pool.Get(ctx)
				if err != nil {
					return err
				}
				it := &item{buf: buf, pool: pool, seq: first + uint64(i), n: int(b.Bytes), b: b}
				if err := eng.pack(ctx, m.seal, buf, b, data, version, m.cfg.Rank, to, it.seq); err != nil {
					it.Release()
					return err
				}
				if err := out.Send(it); err != nil {
					return err
				}
			}
			return nil
		})
		pipeline.Sink(p, fmt.Sprintf("send →%d", to), packed, func(ctx context.Context, in *pipeline.Input[*item]) error {
			for it := range in.All() {
				err := m.cfg.Pairs.Send(ctx, to, it.seq, it.buf, it.n+m.seal.size())
				pipeline.CountBytes(ctx, int64(it.n))
				it.Release()
				if err != nil {
					return err
				}
			}
			return in.Err()
		})
	}
	return p, p.Run(ctx)
}

// shardKey names a shard by its tensor and slice.
func shardKey(name string, s layout.Slice) string { return name + "\x00" + s.String() }

// heldData returns the memory of each of the stream's held tensors, out
// of byKey (the round's shards by shardKey).
func heldData(sc *Schedule, st *Stream, byKey map[string]mem.Buffer) ([]mem.Buffer, error) {
	out := make([]mem.Buffer, len(st.Held))
	for i, h := range st.Held {
		t := sc.Plan.Tensors[h.Tensor]
		out[i] = byKey[shardKey(t.Name, h.Slice)]
		if out[i] == nil && h.Slice.Elements() > 0 {
			return nil, fmt.Errorf("route: the plan reads shard %s %v of this rank, which it was not given", t.Name, h.Slice)
		}
	}
	return out, nil
}

// tracing returns the pipeline options that trace into cfg.Tracer.
func tracing(cfg Config) []pipeline.Option {
	if cfg.Tracer == nil {
		return nil
	}
	return []pipeline.Option{pipeline.WithTracer(cfg.Tracer, cfg.Rank)}
}

// Committed returns the last version committed on every receiver, or 0.
func (s *Sender) Committed() uint64 { return s.m.Committed() }

// MaxBuffers returns the most bucket buffers the rank's pairs held at
// once, all pairs together (two per pair at most; none for a pair that
// borrows the sender's buckets).
func (s *Sender) MaxBuffers() int { return s.m.maxHeld() }

// Close frees the rank's buffers; it is idempotent.
func (s *Sender) Close() error { return s.m.Close() }
