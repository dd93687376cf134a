package zmqbus

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// TestAbortCarriesTheReason: when the root's round fails, every receiver
// fails with the root's reason (ABORTED), not with a bare "root left".
func TestAbortCarriesTheReason(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfgs := transporttest.Configs(t.Name(), 3, 10*time.Second)
	subs := make(chan transport.Subscriber, 2)
	errs := make(chan error, 2)
	for r := 1; r < 3; r++ {
		go func() {
			s, err := OpenSubscriber(ctx, cfgs[r])
			if err != nil {
				errs <- err
				return
			}
			subs <- s
		}()
	}
	pub, err := OpenPublisher(ctx, cfgs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, 0, []byte("bucket 0")); err != nil {
		t.Fatal(err)
	}
	var got []transport.Subscriber
	for range 2 {
		select {
		case s := <-subs:
			defer s.Close()
			got = append(got, s)
		case err := <-errs:
			t.Fatal(err)
		}
	}
	pub.(transport.Aborter).Abort(errors.New("tcp broadcast: rank 2 is gone"))
	for i, s := range got {
		m, err := s.Recv(ctx)
		if err == nil && m.Seq == 0 {
			_, err = s.Recv(ctx)
		}
		if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 2 is gone") {
			t.Errorf("subscriber %d: %v; want ErrAborted with the root's reason", i, err)
		}
	}
	if err := pub.Publish(ctx, 1, []byte("x")); err == nil {
		t.Error("Publish after Abort succeeded")
	}
}

// TestSubscriberAbortReachesTheRoot: a receiver whose round failed tells the
// root why, and the root fails naming that reason.
func TestSubscriberAbortReachesTheRoot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfgs := transporttest.Configs(t.Name(), 2, 10*time.Second)
	subc := make(chan transport.Subscriber, 1)
	go func() {
		s, err := OpenSubscriber(ctx, cfgs[1])
		if err != nil {
			t.Error(err)
		}
		subc <- s
	}()
	pub, err := OpenPublisher(ctx, cfgs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, 0, []byte("bucket 0")); err != nil {
		t.Fatal(err)
	}
	sub := <-subc
	if sub == nil {
		t.FailNow()
	}
	defer sub.Close()
	if _, err := sub.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	sub.(transport.Aborter).Abort(errors.New("tcp broadcast: rank 2 is gone"))
	err = pub.Sync(ctx)
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 2 is gone") || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("root's Sync after a receiver aborted: %v; want ErrAborted naming rank 1 and its reason", err)
	}
}
