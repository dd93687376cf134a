package weightcast

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBucketSizeMismatch: ranks given different bucket sizes fail at the
// join, every one of them at once and alike, as a configuration error
// naming each differing rank, rank 0 and both sizes; no round is needed
// to find out.
func TestBucketSizeMismatch(t *testing.T) {
	o := Options{Group: "buckets", RunID: "b1", Rendezvous: "etcd://" + freeAddr(t), ServeRendezvous: true, Device: "cpu", Timeout: 30 * time.Second}
	sizes := []int64{64 << 10, 64 << 10, 16 << 10}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, len(sizes))
	var wg sync.WaitGroup
	start := time.Now()
	for r, size := range sizes {
		o := o
		o.Rank, o.WorldSize, o.BucketSize = r, len(sizes), size
		wg.Go(func() {
			if r == 0 {
				s, err := OpenSender(ctx, o)
				if err == nil {
					s.Close()
				}
				errs[r] = err
				return
			}
			rc, err := OpenReceiver(ctx, o)
			if err == nil {
				rc.Close()
			}
			errs[r] = err
		})
	}
	wg.Wait()
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the mismatch took %v to find; want it at the join", took)
	}
	for r, err := range errs {
		if err == nil || !errors.Is(err, ErrConfig) || KindOf(err) != KindConfig {
			t.Fatalf("rank %d: %v; want a configuration error", r, err)
		}
		for _, w := range []string{"bucket size mismatch", "rank 2 with 16 KiB (16384 bytes)", "rank 0 with 64 KiB (65536 bytes)"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("rank %d: %v\ndoes not say %q", r, err, w)
			}
		}
		if strings.Contains(err.Error(), "rank 1 with") {
			t.Errorf("rank %d blames rank 1, which has rank 0's size: %v", r, err)
		}
	}
}
