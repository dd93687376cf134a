package stages

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/transport"
)

// TestEndOfRun: when the root closes its metadata bus after its last
// round, a receiver waiting for the end (AwaitEnd) returns nil, and one
// that asks for another round (Sync) learns that the run is over, with
// its model intact; a receiver expecting the end that gets another round
// fails instead.
func TestEndOfRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := synthetic(t, 1<<20, 8, 3, dtype.BF16)
	g := newGroup(t, groupOpts{world: 3, bucket: 256 << 10, checksum: true})
	models := []*memModel{newMemModel(), newMemModel()}
	if err := g.round(ctx, m, 1, []Sink{models[0], models[1]}); err != nil {
		t.Fatal(err)
	}
	g.closers[1]() // the root's publisher: the end of the run
	if err := g.receivers[0].AwaitEnd(ctx); err != nil {
		t.Fatalf("rank 1: AwaitEnd: %v", err)
	}
	_, err := g.receivers[1].Sync(ctx, models[1])
	if !errors.Is(err, transport.ErrEnded) || !strings.Contains(err.Error(), "no round after version 1") {
		t.Fatalf("rank 2: Sync after the end: want ErrEnded, got %v", err)
	}
	for i, r := range g.receivers {
		if r.Committed() != 1 || r.State() != StateIntact {
			t.Fatalf("rank %d after the end: committed %d, state %v", i+1, r.Committed(), r.State())
		}
	}

	// The root goes on with another round where the end was expected.
	g = newGroup(t, groupOpts{world: 2, bucket: 256 << 10, checksum: true})
	if err := g.round(ctx, m, 1, []Sink{newMemModel()}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { g.sender.Sync(ctx, m, 2) })
	err = g.receivers[0].AwaitEnd(ctx)
	g.closers[0]() // the root's round ends too
	g.closers[1]()
	if err == nil || !strings.Contains(err.Error(), "expected the end of the run after version 1") {
		t.Fatalf("AwaitEnd with another round coming: %v", err)
	}
}
