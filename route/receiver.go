package route

import (
	"context"
	"fmt"
	"strings"

	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
)

// Dest is where a receiver's rounds land: its local tensors.
type Dest interface {
	// Tensor returns the memory of the receiver's local tensor for the
	// round beginning: region need of tensor t, row-major, at least
	// need's elements times t's dtype size long, in host memory (a
	// buffer's Host bytes) or, when the rank's buckets are on a GPU,
	// device memory of that GPU. It is called once per local tensor per
	// round, before any of its bytes land.
	Tensor(t layout.Tensor, need layout.Slice) (mem.Buffer, error)
	// Commit is told that version, whose bytes it holds, is committed on
	// every receiver.
	Commit(version uint64) error
	// Abort is told that the round failed: what it holds of it is not a
	// version.
	Abort()
}

// Receiver is one receiving rank of a routed group. A failed round leaves
// it broken.
type Receiver struct {
	m    *member
	need Need
}

// NewReceiver returns a receiving rank (cfg.Rank at or above cfg.Senders)
// that needs need; it starts and allocates nothing.
func NewReceiver(cfg Config, need Need) (*Receiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Rank < cfg.Senders {
		return nil, fmt.Errorf("route: rank %d is a sender (ranks [0, %d) send): use NewSender", cfg.Rank, cfg.Senders)
	}
	if err := need.Validate(); err != nil {
		return nil, fmt.Errorf("route: receiver rank %d: %w", cfg.Rank, err)
	}
	return &Receiver{m: newMember(cfg), need: need}, nil
}

// Sync receives one round into dest: every byte of the receiver's need,
// each bucket's seal checked before any of its bytes are written. It
// returns once the version is committed on every receiver and dest's
// Commit has returned; on an error dest's Abort has been called.
func (r *Receiver) Sync(ctx context.Context, dest Dest) (Stats, error) {
	st, err := r.m.run(ctx, 0, declareNeed(r.need), func(ctx context.Context, sc *Schedule, v uint64) (*pipeline.Pipeline, error) {
		return r.receive(ctx, sc, v, dest)
	}, dest.Commit)
	if err != nil {
		dest.Abort()
	}
	return st, err
}

// SetNeed changes what the receiver needs from the next round on (the
// plan is made again on every rank then).
func (r *Receiver) SetNeed(need Need) error {
	if err := need.Validate(); err != nil {
		return fmt.Errorf("route: receiver rank %d: %w", r.m.cfg.Rank, err)
	}
	r.need = need
	return nil
}

// Schedule returns the schedule of the last round begun, or nil: the
// receiver's local tensors (Needs) and its streams.
func (r *Receiver) Schedule() *Schedule { return r.m.sched }

// receive runs the rank's part: per sender, recv ──► load.
func (r *Receiver) receive(ctx context.Context, sc *Schedule, version uint64, dest Dest) (*pipeline.Pipeline, error) {
	m := r.m
	local := make([]mem.Buffer, len(sc.Needs))
	for i, n := range sc.Needs {
		t := sc.Plan.Tensors[n.Tensor]
		b, err := dest.Tensor(t, n.Slice)
		if err != nil {
			return nil, fmt.Errorf("tensor %s %v: %w", t.Name, n.Slice, err)
		}
		if want := n.Slice.Elements() * int64(t.DType.Size()); int64(b.Len()) < want {
			return nil, fmt.Errorf("tensor %s %v: the destination holds %d bytes, the shard %d", t.Name, n.Slice, b.Len(), want)
		}
		local[i] = b
	}
	p := pipeline.New(fmt.Sprintf("route receive v%d", version), tracing(m.cfg)...)
	for _, st := range sc.Streams {
		from, first := st.Sender, m.next[st.Sender]
		borrow, _ := m.cfg.Pairs.(transport.Borrower)
		borrows := borrow != nil && borrow.Borrows(from) && m.cfg.Device.Kind() != mem.KindHost
		var pool *stages.Pool // a pair that borrows the sender's buckets has no buffers of its own
		if !borrows {
			var err error
			if pool, err = m.pool(from); err != nil {
				return nil, err
			}
		}
		checker, err := m.engine(fmt.Sprintf("recv ←%d", from))
		if err != nil {
			return nil, err
		}
		loader, err := m.engine(fmt.Sprintf("load ←%d", from))
		if err != nil {
			return nil, err
		}
		got := pipeline.Source(p, fmt.Sprintf("recv ←%d", from), 1, func(ctx context.Context, out *pipeline.Output[*item]) error {
			for i := range st.Buckets {
				b := &st.Buckets[i]
				it := &item{seq: first + uint64(i), n: int(b.Bytes), b: b}
				if borrows {
					// The bucket is read where it lies in the sender's
					// buffer, which the sender reuses once it is released.
					buf, lent, err := borrow.Borrow(ctx, from, it.seq, it.n+m.seal.size())
					if err != nil {
						return err
					}
					it.buf, it.lent = buf, lent
				} else {
					buf, err := pool.Get(ctx)
					if err != nil {
						return err
					}
					it.buf, it.pool = buf, pool
					if err := m.cfg.Pairs.Recv(ctx, from, it.seq, buf, it.n+m.seal.size()); err != nil {
						it.Release()
						return err
					}
				}
				if err := checker.check(ctx, m.seal, it.buf, it.n, version, from, m.cfg.Rank, it.seq); err != nil {
					if it.lent != nil {
						it.lent(err)
					} else {
						it.Release()
					}
					return fmt.Errorf("%w (it carries %s)", err, segmentNames(sc, b))
				}
				pipeline.CountBytes(ctx, int64(it.n))
				if err := out.Send(it); err != nil {
					return err
				}
			}
			return nil
		})
		pipeline.Sink(p, fmt.Sprintf("load ←%d", from), got, func(ctx context.Context, in *pipeline.Input[*item]) error {
			for it := range in.All() {
				err := loader.unpack(ctx, it.buf, it.b, local)
				it.Release()
				if err != nil {
					return err
				}
				pipeline.CountBytes(ctx, int64(it.n))
			}
			return in.Err()
		})
	}
	return p, p.Run(ctx)
}

// segmentNames names the tensors of a bucket, for an error.
func segmentNames(sc *Schedule, b *Bucket) string {
	var names []string
	seen := map[int]bool{}
	for _, s := range b.Segments {
		if !seen[s.Tensor] {
			seen[s.Tensor] = true
			names = append(names, sc.Plan.Tensors[s.Tensor].Name)
		}
	}
	if len(names) > 4 {
		return fmt.Sprintf("%s and %d more", strings.Join(names[:4], ", "), len(names)-4)
	}
	return strings.Join(names, ", ")
}

// Committed returns the last version committed on every receiver, or 0.
func (r *Receiver) Committed() uint64 { return r.m.Committed() }

// MaxBuffers returns the most bucket buffers the rank's pairs held at
// once, all pairs together (two per pair at most; none for a pair that
// borrows the sender's buckets).
func (r *Receiver) MaxBuffers() int { return r.m.maxHeld() }

// Close frees the rank's buffers; it is idempotent.
func (r *Receiver) Close() error { return r.m.Close() }
