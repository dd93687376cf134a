package weightcast

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/route"
	"github.com/weightcast/weightcast/stages"
)

// A routed group (Options.Senders > 0) has many senders and sharded
// receivers: see package route. Its ranks open with OpenSender (ranks
// below Senders) and OpenReceiver (the others), as a broadcast group's do,
// and run their rounds with SendShards and ReceiveShards.

// routeConfig is the route package's config of this rank.
func (m *member) routeConfig() route.Config {
	return route.Config{Group: m.opts.Group, Rank: m.opts.Rank, Senders: m.opts.Senders, WorldSize: m.opts.WorldSize,
		Pairs: m.pairs, Exchange: m.group, Publisher: m.pub, Subscriber: m.sub, Device: m.dev,
		BucketSize: int(m.opts.BucketSize), Checksum: !m.opts.NoChecksum, Auth: m.keys, Timeout: m.opts.Timeout,
		Tracer: m.opts.Tracer, Blame: m.blame}
}

// need is a routed receiver's need, from Options (which Validate
// checked).
func (o *Options) need() route.Need {
	if o.TP <= 1 {
		return route.Need{}
	}
	n := route.Need{TP: o.TP, TPRank: o.TPRank, Model: layout.Model{Heads: o.Heads, KVHeads: o.KVHeads}}
	for _, s := range o.TPRules {
		r, _ := layout.ParseRule(s)
		n.Rules = append(n.Rules, r)
	}
	return n
}

// errNotRouted and errRouted explain a call of the other kind of group.
func (m *member) errNotRouted(call string) error {
	return fmt.Errorf("%w: %s: %s is for routed groups (senders above 0); this group broadcasts: use Send and Receive", ErrConfig, m.who(), call)
}

func (m *member) errRouted(call string) error {
	return fmt.Errorf("%w: %s: %s is for a group with one sender that broadcasts; this group is routed (%d senders): use SendShards and ReceiveShards", ErrConfig, m.who(), call, m.opts.Senders)
}

// SendShards sends one round of a routed group: the shards this rank
// holds (route.Local: a global tensor's name, dtype, shape, the slice held
// and its bytes), as model version, which every sender gives alike and
// must be above the last committed one. Every byte some receiver needs
// is sent once, by one sender that holds it, on the plan; shards may
// change between rounds (the group plans again). It returns once every
// receiver has committed version. A failed round fails on every rank and
// leaves the Sender broken.
func (s *Sender) SendShards(ctx context.Context, shards []route.Local, version uint64) (route.Stats, error) {
	if s.rs == nil {
		return route.Stats{}, s.errNotRouted("SendShards")
	}
	var st route.Stats
	err := s.round(ctx, func(ctx context.Context) error {
		var err error
		st, err = s.rs.Sync(ctx, version, shards)
		return err
	})
	if err != nil {
		err = fmt.Errorf("%s, version %d: %w", s.who(), version, err)
	}
	return st, err
}

// SendDim0 sends one round of a routed group from src, of which this
// sender holds its dim-0 chunk of every tensor (route.Dim0: sender rank r
// of Options.Senders, as FSDP shards), read from src's host bytes.
func (s *Sender) SendDim0(ctx context.Context, src stages.Source, version uint64) (route.Stats, error) {
	if s.rs == nil {
		return route.Stats{}, s.errNotRouted("SendDim0")
	}
	shards, err := route.Dim0(ctx, stages.Cast(src, s.opts.RolloutDType), s.opts.Rank, s.opts.Senders)
	if err != nil {
		return route.Stats{}, fmt.Errorf("%s, version %d: %w", s.who(), version, err)
	}
	return s.SendShards(ctx, shards, version)
}

// ReceiveShards receives one round of a routed group into dest (a
// route.Shards keeps the last committed version whole): this receiver's
// need (Options.TP), each bucket checked before its bytes are written. It
// returns once the version is committed on every receiver.
func (r *Receiver) ReceiveShards(ctx context.Context, dest route.Dest) (route.Stats, error) {
	if r.rr == nil {
		return route.Stats{}, r.errNotRouted("ReceiveShards")
	}
	var st route.Stats
	err := r.round(ctx, func(ctx context.Context) error {
		var err error
		st, err = r.rr.Sync(ctx, dest)
		return err
	})
	if err != nil {
		err = fmt.Errorf("%s: %w", r.who(), err)
	}
	return st, err
}

// MaxBuffers returns the most bucket buffers this rank held at once: its
// pool's (at most two), or in a routed group every pair's together.
func (s *Sender) MaxBuffers() int {
	if s.rs != nil {
		return s.rs.MaxBuffers()
	}
	return s.member.MaxBuffers()
}

// MaxBuffers returns the most bucket buffers this rank held at once: its
// pool's (at most two), or in a routed group every pair's together.
func (r *Receiver) MaxBuffers() int {
	if r.rr != nil {
		return r.rr.MaxBuffers()
	}
	return r.member.MaxBuffers()
}
