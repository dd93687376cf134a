package weightcast

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/route"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
)

// Sender is rank 0 of a group: it sends every round.
type Sender struct {
	*member
	s  *stages.Sender
	rs *route.Sender // a routed group's, in place of s

	// devs are the GPUs of tensors handed in by address (SendRefs),
	// opened on first use; reads are their streams for host buckets.
	devs  map[int]*gpu.CUDADevice
	reads map[int]*gpu.Stream
}

// OpenSender makes this process rank 0 of the group o describes and
// returns once every rank has joined and the bus and transport are open.
// o.Rank must be 0.
func OpenSender(ctx context.Context, o Options) (*Sender, error) {
	if _, err := stages.Quantize(source.Tensors{}, o.Quantize); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	m, err := open(ctx, o, "sender")
	if err != nil {
		return nil, err
	}
	s := &Sender{member: m, devs: map[int]*gpu.CUDADevice{}, reads: map[int]*gpu.Stream{}}
	if o.Senders > 0 {
		if s.rs, err = route.NewSender(m.routeConfig()); err != nil {
			m.Close()
			return nil, fmt.Errorf("%w: %s: %w", ErrConfig, m.who(), err)
		}
		m.extra = append(m.extra, s.rs.Close)
		return s, nil
	}
	s.s = stages.NewSender(stages.SenderConfig{
		Endpoint: m.endpoint, Publisher: m.pub, Pool: m.pool, Checksum: !m.opts.NoChecksum, NoDirect: m.opts.NoDirect, NoTurns: m.opts.NoTurns, Auth: m.keys, BucketMAC: m.opts.BucketMAC,
		Tracer: m.opts.Tracer, Rank: 0, Progress: m.opts.Progress, Blame: m.blame,
	})
	// The stages Sender's GPU state goes before the pool; the devices of
	// tensors handed in after it.
	m.extra = append(m.extra, s.s.Close, s.closeDevices)
	return s, nil
}

// Send sends one round: every tensor of src as model version, which must
// be above the last committed one (Options.RolloutDType casts its floating
// tensors first, then Options.Quantize quantizes the weights it picks). It
// returns once every receiver has committed it. A failed round fails on every rank and leaves the Sender
// broken (stages.ErrBroken): open a new group.
func (s *Sender) Send(ctx context.Context, src stages.Source, version uint64) (stages.RoundStats, error) {
	var st stages.RoundStats
	if s.rs != nil {
		return st, s.errRouted("Send")
	}
	src = stages.Cast(src, s.opts.RolloutDType)
	err := s.round(ctx, func(ctx context.Context) error {
		q, err := stages.Quantize(src, s.opts.Quantize)
		if err != nil {
			return err
		}
		st, err = s.s.Sync(ctx, q, version)
		return err
	})
	if err != nil {
		err = fmt.Errorf("%s, version %d: %w", s.who(), version, err)
	}
	return st, err
}

// Committed is the last version every receiver committed, or 0.
func (s *Sender) Committed() uint64 {
	if s.rs != nil {
		return s.rs.Committed()
	}
	return s.s.Committed()
}

func (s *Sender) closeDevices() error {
	var first error
	for k, st := range s.reads {
		if err := st.Close(); err != nil && first == nil {
			first = err
		}
		delete(s.reads, k)
	}
	for k, d := range s.devs {
		if own, ok := s.dev.(*gpu.CUDADevice); ok && own == d {
			delete(s.devs, k)
			continue // closed with the rank's device
		}
		if err := d.Close(); err != nil && first == nil {
			first = err
		}
		delete(s.devs, k)
	}
	return first
}
