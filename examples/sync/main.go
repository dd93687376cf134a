// Command sync is the library examples the README quotes, as a program that
// runs: three ranks sync a synthetic model from rank 0 to the other two,
// twice. First through the front door (package weightcast: syncMember, rank
// 0 serving the rendezvous as under torchrun), then with the stages
// composed by hand (syncRank: the tcp transport, metadata over the ZeroMQ
// bus, an etcd the program embeds). Each rank runs as it would in a process
// of its own on its own host; here they are goroutines of one process, so
// that `go run ./examples/sync` shows the whole thing. After each sync it
// checks that every receiver holds every byte of the model.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
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

// run syncs one version of a synthetic model to two receivers, through the
// front door and then by hand, and checks what they hold each time.
func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	weights, err := source.Synthetic{Size: 16 << 20, Tensors: 30, Seed: 1}.Model()
	if err != nil {
		return err
	}
	const n = 3
	runID := strconv.FormatInt(time.Now().UnixNano(), 36) // new for each launch

	addr, err := freeAddr()
	if err != nil {
		return err
	}
	err = ranks(out, "front door", n, weights, func(rank int, model *sink.HostModel) error {
		o := weightcast.Options{Rank: rank, WorldSize: n, Rendezvous: "etcd://" + addr, ServeRendezvous: rank == 0,
			RunID: runID, BucketSize: 4 << 20}
		return syncMember(ctx, o, weights, 1, model)
	})
	if err != nil {
		return err
	}

	etcd, err := embedetcd.Start(ctx, embedetcd.Options{})
	if err != nil {
		return err
	}
	defer etcd.Close()
	return ranks(out, "by hand", n, weights, func(rank int, model *sink.HostModel) error {
		return syncRank(ctx, []string{etcd.ClientURL()}, runID, rank, n, weights, 1, model)
	})
}

// ranks runs sync for every rank on a goroutine of its own, each loading
// into a model of its own, and checks that every receiver holds weights.
func ranks(out io.Writer, how string, n int, weights *source.SyntheticModel, sync1 func(rank int, model *sink.HostModel) error) error {
	models := make([]*sink.HostModel, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank := range n {
		models[rank] = sink.NewHostModel()
		wg.Go(func() {
			if err := sync1(rank, models[rank]); err != nil {
				errs[rank] = fmt.Errorf("%s: rank %d: %w", how, rank, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for rank := 1; rank < n; rank++ {
		if err := same(weights, models[rank]); err != nil {
			return fmt.Errorf("%s: rank %d: %w", how, rank, err)
		}
		fmt.Fprintf(out, "%s: rank %d holds version %d: %d tensors, identical to rank 0's\n", how, rank, models[rank].Version(), len(models[rank].Names()))
	}
	return nil
}

// freeAddr is a loopback address no one listens on, for the rendezvous
// rank 0 serves.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// [README: the front door]

// syncMember is one rank of a sync group through the front door: o says
// where the group meets (rank 0 serves the rendezvous when
// o.ServeRendezvous is set, as under torchrun, where Options.FromEnv fills
// o); rank 0 sends weights as version step and every other rank loads it
// into model (a sink.HostModel, a DeviceModel, WriteSafetensors(dir), ...).
func syncMember(ctx context.Context, o weightcast.Options, weights stages.Source, step uint64, model stages.Sink) (err error) {
	if o.Rank > 0 {
		return receiveMember(ctx, o, model)
	}
	sender, err := weightcast.OpenSender(ctx, o)
	if err != nil {
		return err
	}
	defer closeInto(&err, sender) // ends the run: receivers waiting in AwaitEnd return
	// Send returns once every receiver has committed step.
	_, err = sender.Send(ctx, weights, step)
	return err
}

// receiveMember is a receiving rank: one round into model, then it waits
// for the sender to end the run.
func receiveMember(ctx context.Context, o weightcast.Options, model stages.Sink) (err error) {
	receiver, err := weightcast.OpenReceiver(ctx, o)
	if err != nil {
		return err
	}
	defer closeInto(&err, receiver)
	if _, err = receiver.Receive(ctx, model); err != nil {
		return err // names the group, this rank and the bucket
	}
	return receiver.AwaitEnd(ctx)
}

// [README: end]

// [README: the library example]

// syncRank is one rank of a sync group: every rank runs it with its own
// rank, and rank 0 sends weights as version step. etcd lists the
// rendezvous's endpoints; runID is the same on every rank of a launch and
// new for each launch. A receiver loads into model: a sink.HostModel, a
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
func same(want *source.SyntheticModel, model *sink.HostModel) error {
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
