// Command sync is the library example the README quotes, as a program that
// runs: three ranks sync a synthetic model from rank 0 to the other two over
// the tcp transport, with metadata over the ZeroMQ bus, meeting at an etcd
// the program embeds. Each rank runs syncRank, as it would in a process of
// its own on its own host; here they are goroutines of one process, so that
// `go run ./examples/sync` shows the whole thing. It then checks that every
// receiver holds every byte of the model.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/tcp"
	"github.com/weightcast/weightcast/transport/zmqbus"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sync:", err)
		os.Exit(1)
	}
}

// run syncs one version of a synthetic model to two receivers and checks
// what they hold.
func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	etcd, err := embedetcd.Start(ctx, embedetcd.Options{})
	if err != nil {
		return err
	}
	defer etcd.Close()
	weights, err := stages.Synthetic{Size: 16 << 20, Tensors: 30, Seed: 1}.Model()
	if err != nil {
		return err
	}

	const n = 3
	runID := strconv.FormatInt(time.Now().UnixNano(), 36) // new for each launch
	models := make([]*stages.HostModel, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank := range n {
		models[rank] = stages.NewHostModel()
		wg.Go(func() {
			if err := syncRank(ctx, []string{etcd.ClientURL()}, runID, rank, n, weights, 1, models[rank]); err != nil {
				errs[rank] = fmt.Errorf("rank %d: %w", rank, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for rank := 1; rank < n; rank++ {
		if err := same(weights, models[rank]); err != nil {
			return fmt.Errorf("rank %d: %w", rank, err)
		}
		fmt.Fprintf(out, "rank %d holds version %d: %d tensors, identical to rank 0's\n", rank, models[rank].Version(), len(models[rank].Names()))
	}
	return nil
}

// [README: the library example]

// syncRank is one rank of a sync group: every rank runs it with its own
// rank, and rank 0 sends weights as version step. etcd lists the
// rendezvous's endpoints; runID is the same on every rank of a launch and
// new for each launch. A receiver loads into model: a stages.HostModel, a
// DeviceModel, WriteSafetensors(dir) or Callback(fn, commit).
func syncRank(ctx context.Context, etcd []string, runID string, rank, n int, weights stages.Source, step uint64, model stages.Sink) (err error) {
	store, err := rendezvous.DialEtcd(ctx, etcd, 10*time.Second)
	if err != nil {
		return err
	}
	group, err := rendezvous.Join(ctx, store, rendezvous.JoinOptions{Group: "policy", RunID: runID, Rank: rank, WorldSize: n})
	if err != nil {
		return err // Join has closed the store
	}
	defer closeInto(&err, group)
	cfg := transport.Config{Group: "policy", Rank: rank, WorldSize: n, Device: mem.Host{}, Exchange: group}
	ep, err := transport.Open(ctx, tcp.Name, cfg) // or ipc.Name, ncclx.Name with a *gpu.CUDADevice
	if err != nil {
		return err
	}
	defer closeInto(&err, ep)
	pool, err := stages.NewPool(cfg.Device, stages.DefaultBuffers, 4<<20) // the double buffer
	if err != nil {
		return err
	}
	defer closeInto(&err, pool)
	if rank == 0 {
		var pub transport.Publisher
		if pub, err = zmqbus.OpenPublisher(ctx, cfg); err != nil {
			return err
		}
		defer closeInto(&err, pub)
		sender := stages.NewSender(stages.SenderConfig{Endpoint: ep, Publisher: pub, Pool: pool, Checksum: true, Rank: rank})
		defer closeInto(&err, sender) // what it keeps between rounds; before the pool
		if _, err = sender.Sync(ctx, weights, step); err != nil {
			return err
		}
	} else {
		var sub transport.Subscriber
		if sub, err = zmqbus.OpenSubscriber(ctx, cfg); err != nil {
			return err
		}
		defer closeInto(&err, sub)
		receiver := stages.NewReceiver(stages.ReceiverConfig{Endpoint: ep, Subscriber: sub, Pool: pool, Rank: rank})
		defer closeInto(&err, receiver)
		if _, err = receiver.Sync(ctx, model); err != nil {
			return err
		}
	}
	// Leave together: a rank that closes its lease while another is
	// still finishing would look to it like a lost peer.
	return group.Barrier(ctx, "done")
}

// closeInto closes c and adds its error to *err.
func closeInto(err *error, c io.Closer) { *err = errors.Join(*err, c.Close()) }

// [README: end]

// same checks that model holds every tensor of want, byte for byte.
func same(want *stages.SyntheticModel, model *stages.HostModel) error {
	for _, t := range want.List() {
		size, err := t.Size()
		if err != nil {
			return err
		}
		buf := make([]byte, size)
		if err := t.ReadAt(buf, 0); err != nil {
			return err
		}
		got, ok := model.Get(t.Name)
		if !ok {
			return fmt.Errorf("tensor %q missing", t.Name)
		}
		if !bytes.Equal(got.Data, buf) {
			return fmt.Errorf("tensor %q differs from the sender's", t.Name)
		}
	}
	return nil
}
