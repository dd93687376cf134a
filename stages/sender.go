package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/blame"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// RoundStats describes one finished (or failed) round on one rank.
type RoundStats struct {
	Version uint64
	Bytes   int64 // filled bucket bytes moved (delivered, for direct buckets)
	Buckets int
	// Direct counts the buckets the receivers read in place in the
	// sender's memory (on the root; see Sender).
	Direct int
	// TurnBuckets, on the root, is how many buckets each receiver copied
	// per turn (see turns.go); 0 where they did not take turns.
	TurnBuckets int
	Tensors     int
	Duration    time.Duration
	Stages      []pipeline.Metrics
	Graph       pipeline.Graph
}

// SenderConfig holds what a root needs across rounds.
type SenderConfig struct {
	Endpoint  transport.Endpoint
	Publisher transport.Publisher
	Pool      *Pool
	// Checksum computes a checksum per bucket that receivers verify.
	Checksum bool
	// Auth, the run's keys when the group has a secret (the same as
	// transport.Config.Auth), has every bucket carry a MAC of its bytes
	// and every message of the round signed, which receivers given the
	// same keys check (see mac.go); nil: neither.
	Auth *auth.Keys
	// BucketMAC is the MAC that Auth's buckets carry (PackConfig.MAC):
	// keyed BLAKE3, the zero value, or Poly1305-AES.
	BucketMAC mac.Kind
	// Tracer, when set, records each round's spans under Rank.
	Tracer *pipeline.Tracer
	Rank   int
	// Wrap, when set, may insert stages between iterate and pack, for
	// example a filter that drops frozen tensors.
	Wrap func(p *pipeline.Pipeline, in *pipeline.Stream[*Tensor]) *pipeline.Stream[*Tensor]
	// Progress, when set, is called after each bucket has been moved.
	Progress func(*wire.BucketMeta)
	// NoDirect packs every bucket even where every receiver could read
	// the sender's device tensors in place (see Sender), to compare.
	NoDirect bool
	// NoTurns has receivers that read a round in place copy it all at
	// once rather than in turns (see turns.go), to compare.
	NoTurns bool
	// Logger is told what the sender falls back from, once each: tensors
	// in memory that CUDA IPC cannot share go through buckets where the
	// receivers could read the others in place. Nil means slog.Default().
	Logger *slog.Logger
	// Blame, when set, is the rank's owner of lost-peer attribution
	// (the front door's): when a round fails on a lost peer
	// (transport.ErrPeerGone), what the bus and its witnesses say is
	// added to the error before the bus is aborted, after a wait of
	// blame.WitnessWait at most for the first word. Nil hears the bus
	// alone.
	Blame *blame.Watch
}

// Sender is the root of a sync group. It keeps its endpoint, publisher and
// buffer pool across rounds; the sequence numbers continue from round to
// round. A failed round leaves it broken: every later Sync returns the
// first failure, since the receivers' view of the stream is unknown.
//
// It owns a Packer, which keeps the GPU state of device buckets from round
// to round; Close frees it. The Pool stays its creator's.
//
// Where every receiver shares the sender's GPU (the Endpoint is a
// transport.DirectReader that says so), buckets of device tensors are
// direct: the receivers copy the tensors straight out of the sender's
// memory (see direct.go), so the tensors handed to Sync must stay
// allocated and unchanged until Sync returns, as for any round.
type Sender struct {
	cfg       SenderConfig
	packer    *Packer
	seq       uint64 // the next message's sequence number
	committed atomic.Uint64
	broken    error
	gpuLane   bool // the trace's "pack (GPU)" lane is named
	// words are the turns' words, once a round had turns; turnsOff: the
	// GPU cannot run them (turns.go).
	words    *turnWords
	turnsOff bool
	// turnBytes, when not 0, replaces the package's turnBytes (tests).
	turnBytes int
}

// NewSender returns a Sender; it starts and allocates nothing.
func NewSender(cfg SenderConfig) *Sender {
	pk := NewPacker()
	pk.logger = cfg.Logger
	return &Sender{cfg: cfg, packer: pk}
}

// Close frees the GPU state the Sender kept between rounds (not its Pool,
// Endpoint or Publisher, which stay their creator's). Call it once no Sync
// runs; Close is idempotent.
func (s *Sender) Close() error {
	err := s.packer.Close()
	if s.words != nil {
		err, s.words = errors.Join(err, s.words.close()), nil
	}
	return err
}

// ErrStaleVersion is wrapped by the refusal of a round whose version is not
// above the last committed one: the caller must give a higher version.
var ErrStaleVersion = errors.New("stale model version")

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
		return RoundStats{}, fmt.Errorf("%w: model version %d is not above the last committed version %d: give every round a higher version", ErrStaleVersion, version, c)
	}
	start := time.Now()
	direct := s.readsDirect()
	turns := s.turns(direct)
	p := s.pipeline(src, version, direct, turns)
	var stats RoundStats
	err := p.Run(ctx)
	s.traceGPU(p)
	if err == nil {
		err = s.cfg.Publisher.Sync(ctx)
	}
	buckets := packed(p.Metrics())
	if err == nil {
		// Every receiver has every bucket: the version is the group's.
		err = AnnounceCommit(ctx, s.cfg.Publisher, s.seq+uint64(buckets), version, s.cfg.Auth)
	}
	stats.Version, stats.Duration, stats.Stages, stats.Graph = version, time.Since(start), p.Metrics(), p.Graph()
	stats.Direct = s.packer.lastDirect()
	if turns != nil && stats.Direct > 0 {
		stats.TurnBuckets = turns.Every
	}
	for _, m := range stats.Stages {
		if m.Stage == "pack" {
			stats.Buckets, stats.Tensors = int(m.ItemsOut), int(m.ItemsIn)
		}
		if m.Stage == "broadcast" {
			stats.Bytes = m.Bytes
		}
	}
	if err != nil {
		if turns != nil {
			// No receiver's wait outlives the round.
			err = errors.Join(err, s.words.release(turns.Round))
		}
		err = abortBus(s.cfg.Publisher, err, s.cfg.Blame) // receivers fail with this reason, not "the root left"
		s.broken = err
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
func (s *Sender) pipeline(src Source, version uint64, direct bool, turns *wire.DirectTurns) *pipeline.Pipeline {
	p := pipeline.New(fmt.Sprintf("send v%d", version), s.tracing()...)
	tensors := Iterate(p, src)
	if s.cfg.Wrap != nil {
		tensors = s.cfg.Wrap(p, tensors)
	}
	pc := PackConfig{Pool: s.cfg.Pool, Version: version, FirstSeq: s.seq, Checksum: s.cfg.Checksum, Direct: direct, Auth: s.cfg.Auth, MAC: s.cfg.BucketMAC, turns: turns}
	if turns != nil {
		pc.turnWords = s.words.buf.DevicePtr()
	}
	if d, ok := src.(Describer); ok {
		pc.Source = d.SourceInfo()
	}
	Broadcast(p, publishStage(p, s.packer.Pack(p, tensors, pc), s.cfg.Publisher, pc.Direct && s.sumsFirst()), s.cfg.Endpoint, s.cfg.Progress)
	return p
}

// sumsFirst reports whether a direct round's checksums (or, with a group
// secret, its MACs) are all computed before its first bucket is
// published: when the sender's GPU is not
// shared through MPS (gpu.CUDADevice.MPS). The receivers' copies and the
// sender's checksum are kernels of different processes, which without MPS
// take turns on the GPU; interleaved bucket by bucket they ran five times
// slower each than alone (docs/benchmarks.md), so the sender sums the
// round first, alone, and the receivers then copy it without waiting for
// it bucket by bucket; only the first messages go out a little ahead of
// the last sums (publishLead), to meet the bus's latency. Under MPS they
// run at once, and each bucket is published as soon as it is summed.
func (s *Sender) sumsFirst() bool {
	if !s.cfg.Checksum && s.cfg.Auth == nil {
		return false
	}
	dev, err := cudaDeviceOf(s.cfg.Pool.Buffers()[0])
	return err == nil && !dev.MPS()
}

// readsDirect reports whether the receivers read device tensors in place
// in the sender's memory (direct buckets): every one of them, by the
// endpoint's word, into device buckets. With a group secret each direct
// bucket carries the MAC of its entries where they lie (see mac.go).
func (s *Sender) readsDirect() bool {
	d, ok := s.cfg.Endpoint.(transport.DirectReader)
	return ok && !s.cfg.NoDirect && d.ReadsDirect() && s.cfg.Pool != nil && s.cfg.Pool.onDevice()
}

// traceGPU adds, to a traced round of device buckets, when the GPU worked
// on each bucket: spans on a lane "pack (GPU)" beside pack's, whose bytes
// over duration is the rate of the copies and checksum themselves (pack's
// own spans only time queueing them).
func (s *Sender) traceGPU(p *pipeline.Pipeline) {
	gpuLane(s.cfg.Tracer, p, s.cfg.Rank, "pack (GPU)", "pack", &s.gpuLane, s.packer.gpuSpans())
}

// Graph describes the pipeline each Sync runs.
func (s *Sender) Graph() pipeline.Graph { return s.pipeline(nil, 0, s.readsDirect(), nil).Graph() }

func (s *Sender) tracing() []pipeline.Option {
	if s.cfg.Tracer == nil {
		return nil
	}
	return []pipeline.Option{pipeline.WithTracer(s.cfg.Tracer, s.cfg.Rank)}
}

// ErrBroken is wrapped by Sync's error on a Sender or Receiver whose earlier
// round failed.
var ErrBroken = errors.New("unusable after a failed round")

// ErrChecksum is wrapped by the error of a round in which a received
// bucket's bytes did not match the checksum the root sent.
var ErrChecksum = errors.New("failed its checksum")
