package stages

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
)

// Publish adds the stage that sends each bucket's metadata through pub
// before passing the bucket on to have its bytes moved. For a device
// bucket whose checksum Pack left pending on the GPU, it first waits for
// the checksum (see gpu_checksum.go).
func Publish(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], pub transport.Publisher) *pipeline.Stream[*Bucket] {
	return pipeline.Stage(p, "publish", in, 1, func(ctx context.Context, in *pipeline.Input[*Bucket], out *pipeline.Output[*Bucket]) (err error) {
		st := &hostStaging{} // device checksums without the GPU kernel
		defer func() { err = errors.Join(err, st.close(ctx)) }()
		for b := range in.All() {
			span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", b.Meta.Seq), map[string]any{"bucket": b.Meta.Seq, "round": b.Meta.Version})
			err := completeSum(ctx, b, st)
			var msg []byte
			if err == nil {
				msg, err = EncodeMeta(&b.Meta)
			}
			if err == nil {
				span.Args(map[string]any{"meta_bytes": len(msg)})
				err = pub.Publish(ctx, b.Meta.Seq, msg)
			}
			span.End()
			if err != nil {
				b.Release()
				return err
			}
			if err := out.Send(b); err != nil {
				return err
			}
		}
		return in.Err()
	})
}

// Broadcast adds the root's last stage: it moves each bucket's filled bytes
// to every receiver through ep, then releases the bucket and, when done is
// not nil, calls it with the bucket's metadata (for progress reports).
func Broadcast(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], ep transport.Endpoint, done func(*BucketMeta)) {
	pipeline.Sink(p, "broadcast", in, func(ctx context.Context, in *pipeline.Input[*Bucket]) error {
		for b := range in.All() {
			span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", b.Meta.Seq), map[string]any{"bucket": b.Meta.Seq, "round": b.Meta.Version, "bytes": b.Meta.Length})
			err := ep.Broadcast(ctx, b.Meta.Seq, b.Buf, int(b.Meta.Length))
			span.End()
			meta := b.Meta
			b.Release()
			if err != nil {
				return err
			}
			pipeline.CountBytes(ctx, meta.Length)
			if done != nil {
				done(&meta)
			}
		}
		return in.Err()
	})
}

// RoundStats describes one finished (or failed) round on one rank.
type RoundStats struct {
	Version  uint64
	Bytes    int64 // filled bucket bytes moved
	Buckets  int
	Tensors  int
	Duration time.Duration
	Stages   []pipeline.Metrics
	Graph    pipeline.Graph
}

// SenderConfig holds what a root needs across rounds.
type SenderConfig struct {
	Endpoint  transport.Endpoint
	Publisher transport.Publisher
	Pool      *Pool
	// Checksum computes a checksum per bucket that receivers verify.
	Checksum bool
	// Tracer, when set, records each round's spans under Rank.
	Tracer *pipeline.Tracer
	Rank   int
	// Wrap, when set, may insert stages between iterate and pack, for
	// example a filter that drops frozen tensors.
	Wrap func(p *pipeline.Pipeline, in *pipeline.Stream[*Tensor]) *pipeline.Stream[*Tensor]
	// Progress, when set, is called after each bucket has been moved.
	Progress func(*BucketMeta)
}

// Sender is the root of a sync group. It keeps its endpoint, publisher and
// buffer pool across rounds; the sequence numbers continue from round to
// round. A failed round leaves it broken: every later Sync returns the
// first failure, since the receivers' view of the stream is unknown.
type Sender struct {
	cfg       SenderConfig
	seq       uint64 // the next message's sequence number
	committed atomic.Uint64
	broken    error
}

// NewSender returns a Sender; it starts nothing.
func NewSender(cfg SenderConfig) *Sender { return &Sender{cfg: cfg} }

// Sync sends one round: every tensor of src, as model version version,
// which must be above the last committed version (versions increase; 0 is
// never a version). Once every receiver has acknowledged every bucket, it
// announces the version committed (AnnounceCommit) and returns when every
// receiver has acknowledged that too.
func (s *Sender) Sync(ctx context.Context, src Source, version uint64) (RoundStats, error) {
	if s.broken != nil {
		return RoundStats{}, fmt.Errorf("sender %w: %w", ErrBroken, s.broken)
	}
	if c := s.committed.Load(); version <= c {
		return RoundStats{}, fmt.Errorf("model version %d is not above the last committed version %d: give every round a higher version", version, c)
	}
	start := time.Now()
	p := s.pipeline(src, version)
	var stats RoundStats
	err := p.Run(ctx)
	if err == nil {
		err = s.cfg.Publisher.Sync(ctx)
	}
	buckets := packed(p.Metrics())
	if err == nil {
		// Every receiver has every bucket: the version is the group's.
		err = AnnounceCommit(ctx, s.cfg.Publisher, s.seq+uint64(buckets), version)
	}
	stats.Version, stats.Duration, stats.Stages, stats.Graph = version, time.Since(start), p.Metrics(), p.Graph()
	for _, m := range stats.Stages {
		if m.Stage == "pack" {
			stats.Buckets, stats.Tensors = int(m.ItemsOut), int(m.ItemsIn)
		}
		if m.Stage == "broadcast" {
			stats.Bytes = m.Bytes
		}
	}
	if err != nil {
		s.broken = err
		if a, ok := s.cfg.Publisher.(transport.Aborter); ok {
			a.Abort(err) // receivers fail with this reason, not "the root left"
		}
		return stats, err
	}
	s.seq += uint64(buckets) + 1 // the buckets and the commit message
	s.committed.Store(version)
	return stats, nil
}

// Committed returns the last version this Sender committed on every
// receiver, or 0 before the first. It may be called while Sync runs.
func (s *Sender) Committed() uint64 { return s.committed.Load() }

// packed counts the buckets the pack stage sent on.
func packed(ms []pipeline.Metrics) int {
	for _, m := range ms {
		if m.Stage == "pack" {
			return int(m.ItemsOut)
		}
	}
	return 0
}

// pipeline builds one round's pipeline:
// iterate ──► [Wrap] ──► pack ──► publish ──► broadcast.
func (s *Sender) pipeline(src Source, version uint64) *pipeline.Pipeline {
	p := pipeline.New(fmt.Sprintf("send v%d", version), s.tracing()...)
	tensors := Iterate(p, src)
	if s.cfg.Wrap != nil {
		tensors = s.cfg.Wrap(p, tensors)
	}
	pc := PackConfig{Pool: s.cfg.Pool, Version: version, FirstSeq: s.seq, Checksum: s.cfg.Checksum}
	if d, ok := src.(Describer); ok {
		pc.Source = d.SourceInfo()
	}
	Broadcast(p, Publish(p, Pack(p, tensors, pc), s.cfg.Publisher), s.cfg.Endpoint, s.cfg.Progress)
	return p
}

// Graph describes the pipeline each Sync runs.
func (s *Sender) Graph() pipeline.Graph { return s.pipeline(nil, 0).Graph() }

func (s *Sender) tracing() []pipeline.Option {
	if s.cfg.Tracer == nil {
		return nil
	}
	return []pipeline.Option{pipeline.WithTracer(s.cfg.Tracer, s.cfg.Rank)}
}

// ErrBroken is wrapped by Sync's error on a Sender or Receiver whose earlier
// round failed.
var ErrBroken = errors.New("unusable after a failed round")
