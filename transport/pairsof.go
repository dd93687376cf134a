package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/weightcast/weightcast/mem"
)

// PairsOf makes the point-to-point mode of a broadcast transport out of
// its two-rank groups: every sender–receiver pair of a routed group opens
// an Endpoint of its own with open, the sender as that group's root (rank
// 0) and the receiver as its one receiver (rank 1), meeting through the
// routed group's Exchange under keys of the pair's own. Send is the
// pair's Broadcast on the sender, which returns once the receiver has the
// bytes; Recv is its Broadcast on the receiver. Each pair's endpoint keeps
// its own connections, so pairs move at once.
//
// It suits transports whose two-rank groups are cheap and independent
// (ipc: one side channel and the receiver's copies per pair); every rank
// opens max(senders, receivers) endpoints.
func PairsOf(open Opener) PairsOpener {
	return func(ctx context.Context, cfg Config) (Pairs, error) {
		if err := cfg.ValidatePairs(); err != nil {
			return nil, err
		}
		p := &pairsOf{rank: cfg.Rank, sending: cfg.Sends(cfg.Rank), eps: map[int]Endpoint{}}
		var peers []int
		if cfg.Sends(cfg.Rank) {
			for r := cfg.senders(); r < cfg.WorldSize; r++ {
				peers = append(peers, r)
			}
		} else {
			for s := range cfg.senders() {
				peers = append(peers, s)
			}
		}
		var mu sync.Mutex
		errs := make([]error, len(peers))
		var wg sync.WaitGroup
		for i, peer := range peers {
			wg.Go(func() {
				ep, err := open(ctx, pairConfig(cfg, peer))
				if err != nil {
					errs[i] = fmt.Errorf("the pair of ranks %d and %d: %w", min(cfg.Rank, peer), max(cfg.Rank, peer), err)
					return
				}
				mu.Lock()
				p.eps[peer] = ep
				mu.Unlock()
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			p.Close()
			return nil, err
		}
		return p, nil
	}
}

// pairConfig is the config of the two-rank group of cfg.Rank and peer.
func pairConfig(cfg Config, peer int) Config {
	snd, rcv := cfg.Rank, peer
	if !cfg.Sends(cfg.Rank) {
		snd, rcv = peer, cfg.Rank
	}
	c := cfg
	c.WorldSize, c.Senders = 2, 0
	c.Rank = 0
	if cfg.Rank == rcv {
		c.Rank = 1
	}
	if cfg.Exchange != nil {
		c.Exchange = pairExchange{x: cfg.Exchange, ranks: [2]int{snd, rcv}, prefix: fmt.Sprintf("pair.%d.%d.", snd, rcv)}
	}
	return c
}

// pairExchange is a pair's view of the routed group's Exchange: its ranks
// 0 and 1 are the pair's sender and receiver, its keys the pair's own.
type pairExchange struct {
	x      Exchange
	ranks  [2]int
	prefix string
}

func (e pairExchange) Put(ctx context.Context, key string, value []byte) error {
	return e.x.Put(ctx, e.prefix+key, value)
}

func (e pairExchange) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	if rank < 0 || rank > 1 {
		return nil, fmt.Errorf("rank %d of a pair's group of two", rank)
	}
	return e.x.Get(ctx, e.ranks[rank], e.prefix+key)
}

// pairsOf is PairsOf's Pairs: an endpoint per peer.
type pairsOf struct {
	rank    int
	sending bool
	eps     map[int]Endpoint
}

func (p *pairsOf) endpoint(op string, peer int) (Endpoint, error) {
	ep, ok := p.eps[peer]
	if !ok {
		return nil, fmt.Errorf("transport: %s with rank %d, which this rank exchanges no buckets with (a sender with a receiver only)", op, peer)
	}
	return ep, nil
}

// Send moves buf[:n] to receiver to: the pair's Broadcast on its root.
func (p *pairsOf) Send(ctx context.Context, to int, seq uint64, buf mem.Buffer, n int) error {
	ep, err := p.endpoint("send", to)
	if err != nil {
		return err
	}
	return p.rename(ep.Broadcast(ctx, seq, buf, n), to)
}

// Recv lands bucket seq from sender from in buf: the pair's Broadcast on
// its receiver.
func (p *pairsOf) Recv(ctx context.Context, from int, seq uint64, buf mem.Buffer, n int) error {
	ep, err := p.endpoint("recv", from)
	if err != nil {
		return err
	}
	return p.rename(ep.Broadcast(ctx, seq, buf, n), from)
}

// Borrows reports whether the pair with sender from lends its buckets
// (its endpoint is a Lender that lends: ipc on the sender's GPU).
func (p *pairsOf) Borrows(from int) bool {
	l, ok := p.eps[from].(Lender)
	return ok && !p.sending && l.Lends()
}

// Borrow is the pair's Lend on its receiver.
func (p *pairsOf) Borrow(ctx context.Context, from int, seq uint64, n int) (mem.Buffer, func(error) error, error) {
	ep, err := p.endpoint("borrow", from)
	if err != nil {
		return nil, nil, err
	}
	l, ok := ep.(Lender)
	if !ok || p.sending || !l.Lends() {
		return nil, nil, fmt.Errorf("transport: the pair with rank %d does not lend its buckets (Borrows says so)", from)
	}
	buf, release, err := l.Lend(ctx, seq, n)
	return buf, release, p.rename(err, from)
}

// rename restates a pair endpoint's *Error in the routed group's ranks:
// this rank and peer, rather than the pair's ranks 0 and 1.
func (p *pairsOf) rename(err error, peer int) error {
	var te *Error
	if err == nil || !errors.As(err, &te) {
		return err
	}
	snd, rcv := p.rank, peer
	if !p.sending {
		snd, rcv = peer, p.rank
	}
	return &Error{Transport: te.Transport, Group: te.Group, Rank: p.rank, Op: te.Op, Seq: te.Seq, HasSeq: te.HasSeq, Peer: peer,
		Err: fmt.Errorf("in the group of two of sender rank %d (its rank 0) and receiver rank %d (its rank 1): %w", snd, rcv, te.Err)}
}

// Close closes every pair's endpoint. It is idempotent.
func (p *pairsOf) Close() error {
	var errs []error
	for _, ep := range p.eps {
		errs = append(errs, ep.Close())
	}
	return errors.Join(errs...)
}
