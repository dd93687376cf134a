package rendezvous_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/rendezvous"
)

// TestWaitSurvivesCompaction checks Wait and WaitAbsent on etcd when the
// history they watch from is compacted away.
func TestWaitSurvivesCompaction(t *testing.T) {
	e := startEmbedded(t)
	urls := []string{e.ClientURL()}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	writer := dial(t, urls, 5*time.Second)
	churn := func(p string) {
		for i := range 10 {
			if err := rendezvous.Put(ctx, writer, fmt.Sprintf("%s/churn/%d", p, i), "x"); err != nil {
				t.Error(err)
			}
		}
		if err := rendezvous.Compact(ctx, writer); err != nil {
			t.Error(err)
		}
	}

	t.Run("CompactWhileWaiting", func(t *testing.T) {
		waiter := dial(t, urls, 5*time.Second)
		got := make(chan error, 1)
		go func() {
			v, err := waiter.Wait(ctx, "/c1/key")
			if err == nil && string(v) != "v" {
				err = fmt.Errorf("got %q", v)
			}
			got <- err
		}()
		time.Sleep(200 * time.Millisecond)
		churn("/c1")
		if _, _, err := writer.Create(ctx, "/c1/key", []byte("v")); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("wait across a compaction: %v", err)
		}
	})

	// The key appears between Wait's read and its watch, and the history
	// holding it is compacted before the watch starts: the watch is told
	// its start revision is gone, so Wait must read again.
	t.Run("CreatedAndCompactedBeforeWatch", func(t *testing.T) {
		waiter := dial(t, urls, 5*time.Second)
		var once sync.Once
		rendezvous.SetAfterRead(waiter, func() {
			once.Do(func() {
				if _, _, err := writer.Create(ctx, "/c2/key", []byte("v")); err != nil {
					t.Error(err)
				}
				churn("/c2")
			})
		})
		v, err := waiter.Wait(ctx, "/c2/key")
		if err != nil || string(v) != "v" {
			t.Fatalf("wait = %q, %v; want \"v\"", v, err)
		}
	})

	t.Run("DeletedAndCompactedBeforeWatch", func(t *testing.T) {
		waiter := dial(t, urls, 5*time.Second)
		if _, _, err := writer.Create(ctx, "/c3/key", []byte("v")); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		rendezvous.SetAfterRead(waiter, func() {
			once.Do(func() {
				if err := writer.DeletePrefix(ctx, "/c3/key"); err != nil {
					t.Error(err)
				}
				churn("/c3")
			})
		})
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		defer wcancel()
		if err := waiter.WaitAbsent(wctx, "/c3/key"); err != nil {
			t.Fatalf("wait-absent: %v", err)
		}
	})

	// Watching from a compacted revision really fails, so the subtests
	// above test the re-read: a watch alone would not have seen the key.
	t.Run("CompactedWatchFails", func(t *testing.T) {
		if err := rendezvous.WatchFrom(ctx, writer, "/c2/key", 1); err == nil {
			t.Fatal("a watch from compacted revision 1 did not fail")
		}
	})
}
