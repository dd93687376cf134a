package rendezvous

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Abandon closes s's client without revoking its lease, as a killed
// process would leave it: the leased keys stay until the TTL runs out.
func Abandon(s *Etcd) { s.abandon() }

// SetAfterRead makes Wait and WaitAbsent call f between their read and
// their watch. Set it before using s.
func SetAfterRead(s *Etcd, f func()) { s.afterRead = f }

// Compact compacts the store's history up to its current revision.
func Compact(ctx context.Context, s *Etcd) error {
	resp, err := s.client.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	if _, err := s.client.Compact(ctx, resp.Header.Revision); err != nil {
		return fmt.Errorf("compact to %d: %w", resp.Header.Revision, err)
	}
	return nil
}

// Put writes key unconditionally (for tests that need history to compact).
func Put(ctx context.Context, s *Etcd, key, value string) error {
	_, err := s.client.Put(ctx, key, value)
	return err
}

// WatchFrom watches key from revision rev and returns the first response's
// error.
func WatchFrom(ctx context.Context, s *Etcd, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range s.client.Watch(wctx, key, clientv3.WithRev(rev)) {
		return wr.Err()
	}
	return ctx.Err()
}

// RevokeLease revokes s's lease behind its back, as the server does when
// keep-alives stop arriving for a TTL.
func RevokeLease(ctx context.Context, s *Etcd) error {
	s.mu.Lock()
	sess := s.session
	s.mu.Unlock()
	if sess == nil {
		return fmt.Errorf("store has no lease yet")
	}
	_, err := s.client.Revoke(ctx, sess.Lease())
	return err
}

// LeaseDone returns the channel closed when s's lease stops being kept
// alive.
func LeaseDone(s *Etcd) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session.Done()
}
