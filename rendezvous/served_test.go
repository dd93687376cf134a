package rendezvous_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/rendezvoustest"
)

// TestServedRun: the run id rank 0 publishes on the rendezvous it serves
// is what the other ranks read, whether they wait before or after it is
// written; with a secret a stranger's record is replaced by rank 0 and
// waited past by the others; without rank 0 the wait times out naming it.
func TestServedRun(t *testing.T) {
	ctx := context.Background()
	secret, err := auth.NewSecret([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*auth.Secret{nil, secret} {
		m := rendezvoustest.NewMem()
		id := rendezvous.NewRunID()
		if !rendezvous.ValidName(id) || id == rendezvous.NewRunID() {
			t.Fatalf("NewRunID gave %q; want a fresh valid name each time", id)
		}
		got := make(chan string, 1)
		go func() {
			v, err := rendezvous.AwaitServedRun(ctx, m.NewStore(), "g", 1, s, 10*time.Second)
			if err != nil {
				t.Error(err)
			}
			got <- v
		}()
		if s != nil {
			// A stranger writes first: rank 0 replaces it, the waiting
			// rank goes past it.
			if _, _, err := m.NewStore().Create(ctx, rendezvous.ServedRunKey("g"), []byte("stranger")); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
		if err := rendezvous.PublishServedRun(ctx, m.NewStore(), "g", id, s); err != nil {
			t.Fatal(err)
		}
		if v := <-got; v != id {
			t.Fatalf("secret %v: a rank waiting read run id %q; rank 0 published %q", s != nil, v, id)
		}
		if v, err := rendezvous.AwaitServedRun(ctx, m.NewStore(), "g", 2, s, time.Second); err != nil || v != id {
			t.Fatalf("secret %v: a late rank read %q, %v; want %q", s != nil, v, err, id)
		}
	}
	_, err = rendezvous.AwaitServedRun(ctx, rendezvoustest.NewMem().NewStore(), "g", 2, nil, 100*time.Millisecond)
	var re *rendezvous.Error
	if !errors.Is(err, rendezvous.ErrTimeout) || !errors.As(err, &re) || re.Rank != 2 || len(re.Ranks) != 1 || re.Ranks[0] != 0 {
		t.Fatalf("no rank 0: %v; want ErrTimeout naming rank 0", err)
	}
	if err := rendezvous.PublishServedRun(ctx, rendezvoustest.NewMem().NewStore(), "g", "a/b", nil); !errors.Is(err, rendezvous.ErrInvalid) {
		t.Fatalf("publishing run id a/b: %v; want ErrInvalid", err)
	}
}
