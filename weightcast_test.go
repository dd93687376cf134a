package weightcast

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/internal/testhook"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/ncclx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var groupID atomic.Int64

// ranks opens a sender and world-1 receivers concurrently, as separate
// processes would, and closes them when the test ends.
func ranks(t *testing.T, world int, o Options) (*Sender, []*Receiver) {
	t.Helper()
	opts := make([]Options, world)
	for r := range world {
		opts[r] = o
		opts[r].Rank, opts[r].WorldSize = r, world
		if r > 0 {
			opts[r].ServeRendezvous = false // only rank 0 serves
		}
	}
	return openRanks(t, opts)
}

// openRanks opens rank r with opts[r] (rank 0 the sender), all at once, as
// separate processes would, and closes them when the test ends.
func openRanks(t *testing.T, opts []Options) (*Sender, []*Receiver) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var s *Sender
	rs := make([]*Receiver, len(opts)-1)
	errs := make([]error, len(opts))
	var wg sync.WaitGroup
	for r, o := range opts {
		wg.Go(func() {
			if r == 0 {
				s, errs[0] = OpenSender(ctx, o)
			} else {
				rs[r-1], errs[r] = OpenReceiver(ctx, o)
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, r := range rs {
			if r != nil {
				wg.Go(func() { r.Close() })
			}
		}
		if s != nil {
			wg.Go(func() { s.Close() })
		}
		wg.Wait()
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return s, rs
}

func randomTensors(rng *rand.Rand, n int, maxBytes int) source.Tensors {
	var ts source.Tensors
	for i := range n {
		b := make([]byte, rng.IntN(maxBytes+1)&^3)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		ts = append(ts, &stages.Tensor{Name: fmt.Sprintf("layer.%d", i), DType: dtype.F32, Shape: []int64{int64(len(b) / 4)}, Data: b})
	}
	return ts
}

// syncRound sends src as version and receives it on every receiver into
// its sink.
func syncRound(ctx context.Context, s *Sender, rs []*Receiver, send func(context.Context) error, sinks []stages.Sink) error {
	errs := make([]error, len(rs)+1)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = send(ctx) })
	for i, r := range rs {
		wg.Go(func() { _, errs[i+1] = r.Receive(ctx, sinks[i]) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func checkModels(t *testing.T, src source.Tensors, models []*sink.HostModel) {
	t.Helper()
	for i, m := range models {
		for _, tn := range src {
			got, ok := m.Get(tn.Name)
			if !ok || !bytes.Equal(got.Data, tn.Data) {
				t.Fatalf("receiver %d: tensor %q differs", i+1, tn.Name)
			}
		}
	}
}

// TestInProcess runs three versions over inproc, one of them by address.
func TestInProcess(t *testing.T) {
	o := Options{Group: fmt.Sprintf("inproc-%d", groupID.Add(1)), Transport: "inproc", BucketSize: 4 << 10}
	s, rs := ranks(t, 3, o)
	if name, _ := s.Transport(); name != "inproc" {
		t.Fatalf("transport %q", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 2))
	models := []*sink.HostModel{sink.NewHostModel(), sink.NewHostModel()}
	for v := uint64(1); v <= 3; v++ {
		src := randomTensors(rng, 50, 12<<10)
		send := func(ctx context.Context) error { _, err := s.Send(ctx, src, v); return err }
		if v == 2 {
			refs := make([]Ref, len(src))
			for i, tn := range src {
				refs[i] = Ref{Name: tn.Name, DType: "f32", Shape: tn.Shape, Data: tn.Data}
			}
			send = func(ctx context.Context) error { _, err := s.SendRefs(ctx, refs, v); return err }
		}
		if err := syncRound(ctx, s, rs, send, []stages.Sink{models[0], models[1]}); err != nil {
			t.Fatalf("version %d: %v", v, err)
		}
		checkModels(t, src, models)
		if s.Committed() != v || rs[0].Committed() != v || rs[1].Committed() != v {
			t.Fatalf("committed %d, %d, %d after version %d", s.Committed(), rs[0].Committed(), rs[1].Committed(), v)
		}
	}
	if s.MaxBuffers() > stages.DefaultBuffers {
		t.Fatalf("sender held %d buffers", s.MaxBuffers())
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestTorchrunStyle has rank 0 serve the rendezvous on the address every
// rank got from MASTER_ADDR and MASTER_PORT, as torchrun launches do, and
// "auto" pick tcp on a machine without a GPU.
func TestTorchrunStyle(t *testing.T) {
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	env := map[string]string{"MASTER_ADDR": host, "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": "run-1", "WORLD_SIZE": "3", "RANK": "0"}
	o, err := Options{Rank: -1, BucketSize: 8 << 10, Group: "torchrun", Device: "cpu", Timeout: 30 * time.Second}.FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if o.Rank != 0 || o.WorldSize != 3 || o.Rendezvous != "etcd://"+addr || !o.ServeRendezvous || o.RunID != "run-1" {
		t.Fatalf("FromEnv: %+v", o)
	}
	s, rs := ranks(t, 3, o)
	name, reason := s.Transport()
	if name != "tcp" || !strings.Contains(reason, "no GPU") {
		t.Fatalf("auto chose %q (%s), want tcp", name, reason)
	}
	for _, r := range rs {
		if n, _ := r.Transport(); n != name {
			t.Fatalf("rank %d chose %q, rank 0 %q", r.Rank(), n, name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(3, 4))
	models := []*sink.HostModel{sink.NewHostModel(), sink.NewHostModel()}
	for v := uint64(1); v <= 2; v++ {
		src := randomTensors(rng, 30, 20<<10)
		send := func(ctx context.Context) error { _, err := s.Send(ctx, src, v); return err }
		if err := syncRound(ctx, s, rs, send, []stages.Sink{models[0], models[1]}); err != nil {
			t.Fatalf("version %d: %v", v, err)
		}
		checkModels(t, src, models)
	}
}

// TestAbortBetweenRounds aborts the sender while the receivers wait for a
// round: they fail at once with the cause.
func TestAbortBetweenRounds(t *testing.T) {
	addr := freeAddr(t)
	o := Options{Group: "abort", RunID: "a1", Rendezvous: "etcd://" + addr, ServeRendezvous: true, BucketSize: 4 << 10, Timeout: 30 * time.Second}
	s, rs := ranks(t, 3, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() { _, errs[i] = r.Receive(ctx, sink.NewHostModel()) })
	}
	time.Sleep(100 * time.Millisecond) // let them wait; the abort must reach them either way
	start := time.Now()
	s.Abort(errors.New("the trainer's generator raised ValueError: bad shard"))
	wg.Wait()
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "bad shard") {
			t.Fatalf("receiver %d: %v", i+1, err)
		}
		if k := KindOf(err); k != KindAborted {
			t.Errorf("receiver %d: kind %d for %v", i+1, k, err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("receivers took %v to fail", d)
	}
	if _, err := s.Send(ctx, source.Tensors{}, 1); err == nil || !errors.Is(err, stages.ErrBroken) {
		t.Fatalf("send after abort: %v", err)
	}
	// Receivers leave first: rank 0 serves the rendezvous they revoke
	// their leases on.
	for _, r := range rs {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Send(ctx, source.Tensors{}, 1); KindOf(err) != KindClosed {
		t.Fatalf("send after close: %v", err)
	}
}

// TestBadRefs sends tensors that cannot be sent as given: the round fails
// on every rank with an error naming the tensor.
func TestBadRefs(t *testing.T) {
	cases := []struct {
		ref  Ref
		want string
	}{
		{Ref{Name: "w.strided", DType: "F32", Shape: []int64{2, 2}, Data: make([]byte, 16), Strided: true}, `tensor "w.strided" (F32[2 2]) is not contiguous`},
		{Ref{Name: "w.complex", DType: "complex64", Shape: []int64{2}, Data: make([]byte, 16)}, `tensor "w.complex" has dtype "complex64", which weightcast cannot send`},
		{Ref{Name: "w.short", DType: "F32", Shape: []int64{4}, Data: make([]byte, 8)}, `tensor "w.short" is F32[4], 16 bytes, but 8 bytes were handed in`},
	}
	for i, c := range cases {
		t.Run(c.ref.Name, func(t *testing.T) {
			o := Options{Group: fmt.Sprintf("bad-%d", i), RunID: "r", Rendezvous: "etcd://" + freeAddr(t), ServeRendezvous: true, BucketSize: 4 << 10, Timeout: 30 * time.Second}
			s, rs := ranks(t, 2, o)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			refs := []Ref{{Name: "ok", DType: "U8", Shape: []int64{3}, Data: []byte{1, 2, 3}}, c.ref}
			var sendErr error
			err := syncRound(ctx, s, rs, func(ctx context.Context) error { _, sendErr = s.SendRefs(ctx, refs, 1); return sendErr }, []stages.Sink{sink.NewHostModel()})
			if sendErr == nil || !strings.Contains(sendErr.Error(), c.want) || KindOf(sendErr) != KindConfig {
				t.Fatalf("sender: %v (kind %d), want %q", sendErr, KindOf(sendErr), c.want)
			}
			if err == nil || strings.Count(err.Error(), c.ref.Name) < 2 {
				t.Fatalf("the receiver does not name the tensor: %v", err)
			}
		})
	}
}

func TestOptions(t *testing.T) {
	base := Options{Rendezvous: "etcd://127.0.0.1:1", RunID: "r", WorldSize: 2}
	cases := []struct {
		role string
		mod  func(*Options)
		want string
	}{
		{"sender", func(o *Options) { o.Rank = 1 }, "the sender is rank 0"},
		{"receiver", func(o *Options) { o.Rank = 0 }, "rank 0 is the sender"},
		{"receiver", func(o *Options) { o.Rank = 2 }, "rank 2 is outside a world of 2 ranks"},
		{"sender", func(o *Options) { o.WorldSize = 1 }, "world_size 1: a group needs"},
		{"sender", func(o *Options) { o.RunID = "" }, "run_id: none given"},
		{"sender", func(o *Options) { o.Rendezvous = "10.0.0.1:2379" }, "want etcd://HOST:PORT"},
		{"sender", func(o *Options) { o.Transport = "udp" }, `transport "udp"`},
		{"sender", func(o *Options) { o.BucketSize = 10 }, "bucket 10 is below the minimum of 1.0 KiB"},
		{"sender", func(o *Options) { o.Device = "tpu:0" }, `device "tpu:0"`},
		{"sender", func(o *Options) { o.Transport, o.Rendezvous = "inproc", "etcd://a:1" }, "leave it empty"},
	}
	for _, c := range cases {
		o := base
		if c.role == "receiver" {
			o.Rank = 1
		}
		c.mod(&o)
		err := o.check(c.role)
		if err == nil || !strings.Contains(err.Error(), c.want) || KindOf(err) != KindConfig {
			t.Errorf("%+v as %s: %v, want %q", o, c.role, err, c.want)
		}
	}
	if err := base.check("sender"); err != nil {
		t.Fatal(err)
	}
	// A rendezvous rank 0 serves is the run's own: no run id needed.
	served := base
	served.RunID, served.ServeRendezvous = "", true
	if err := served.check("receiver"); err == nil {
		t.Fatal("a receiver (rank 0) was accepted")
	}
	served.Rank = 1
	if err := served.check("receiver"); err != nil {
		t.Fatalf("no run id with a served rendezvous: %v", err)
	}
	env := map[string]string{"RANK": "x"}
	if _, err := (Options{Rank: -1}).FromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), `RANK="x"`) {
		t.Fatalf("bad RANK: %v", err)
	}
	env = map[string]string{"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h"}
	if _, err := (Options{Rank: -1}).FromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "set both") {
		t.Fatalf("MASTER_PORT missing: %v", err)
	}
	env = map[string]string{"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "29500", "LOCAL_RANK": "3"}
	o, err := (Options{Rank: -1}).FromEnv(func(k string) string { return env[k] })
	if err != nil || o.Rank != 1 || o.WorldSize != 4 || o.Rendezvous != "etcd://h:29500" || o.Device != "cuda:3" {
		t.Fatalf("FromEnv: %+v, %v", o, err)
	}
}

// TestChooseTransport: "auto" over the registry picks what the front
// door's rules always picked, with the same reasons.
func TestChooseTransport(t *testing.T) {
	p := func(rank int, host string, gpus int, nccl bool) transport.Peer {
		ok := "0"
		if nccl {
			ok = "1"
		}
		return transport.Peer{Rank: rank, Facts: map[string]string{
			transport.FactHost: host, transport.FactGPUs: strconv.Itoa(gpus), ncclx.FactNCCL: ok}}
	}
	cases := []struct {
		peers        []transport.Peer
		want, reason string
	}{
		{[]transport.Peer{p(0, "a", 8, true), p(1, "a", 8, true), p(2, "a", 8, true)}, "nccl", "8 GPUs, one per rank"},
		{[]transport.Peer{p(0, "a", 1, true), p(1, "a", 1, true), p(2, "a", 1, true)}, "ipc", "3 ranks share 1 GPU(s) of this host"},
		{[]transport.Peer{p(0, "a", 2, true), p(1, "a", 2, true), p(2, "a", 2, true)}, "ipc", "3 ranks share 2 GPU(s) of this host"},
		{[]transport.Peer{p(0, "a", 8, false), p(1, "a", 8, false)}, "ipc", "2 ranks share 8 GPU(s) of this host"},
		{[]transport.Peer{p(0, "a", 8, true), p(1, "b", 0, false)}, "tcp", "rank 1 has no GPU"},
		{[]transport.Peer{p(0, "a", 0, false), p(1, "a", 0, false)}, "tcp", "rank 0 has no GPU"},
		{[]transport.Peer{p(0, "a", 1, true), p(1, "b", 1, true)}, "nccl", "2 hosts, one GPU per rank"},
		{[]transport.Peer{p(0, "a", 1, true), p(1, "b", 1, true), p(2, "b", 1, true)}, "tcp", "2 hosts without one GPU and NCCL for every rank"},
		{[]transport.Peer{p(0, "a", 8, false), p(1, "b", 8, true)}, "tcp", "2 hosts without one GPU and NCCL for every rank"},
	}
	for _, c := range cases {
		d, why, err := transport.Choose(c.peers)
		if err != nil || d.Name != c.want || why != c.reason {
			t.Errorf("%+v: %s (%s), %v; want %s (%s)", c.peers, d.Name, why, err, c.want, c.reason)
		}
	}
	peers := []transport.Peer{p(0, "a", 1, true), p(1, "b", 1, true), p(2, "a", 1, true), p(3, "b", 1, true)}
	for r, want := range []int{0, 0, 1, 1} {
		if got := localIndex(peers, r); got != want {
			t.Errorf("rank %d: local index %d, want %d", r, got, want)
		}
	}
}

// TestPeerGoneAcrossShortRounds kills the rendezvous under a run of short
// rounds: the lost-peer grace must not restart with every round, so a
// round fails naming the rendezvous soon after the loss is seen.
func TestPeerGoneAcrossShortRounds(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a lease to expire")
	}
	emb, err := embedetcd.Start(context.Background(), embedetcd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Group: "short-rounds", RunID: "s1", Rendezvous: "etcd://" + strings.TrimPrefix(emb.ClientURL(), "http://"), Transport: "tcp", Device: "cpu", BucketSize: 4 << 10, Timeout: 20 * time.Second}
	s, rs := ranks(t, 2, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	emb.Close()
	src := randomTensors(rand.New(rand.NewPCG(5, 6)), 4, 1<<10)
	start := time.Now()
	var err2 error
	for v := uint64(1); v < 100000 && err2 == nil; v++ {
		send := func(ctx context.Context) error { _, err := s.Send(ctx, src, v); return err }
		err2 = syncRound(ctx, s, rs, send, []stages.Sink{sink.NewHostModel()})
	}
	if err2 == nil || !strings.Contains(err2.Error(), "rendezvous") && !strings.Contains(err2.Error(), "etcd") && !strings.Contains(err2.Error(), "lease") {
		t.Fatalf("rounds after the rendezvous died: %v", err2)
	}
	if d := time.Since(start); d > 40*time.Second {
		t.Fatalf("took %v to notice", d)
	}
}

// TestEndOfRun: after the last round the sender's Close ends the run;
// a receiver waiting for it with AwaitEnd returns, and one that asks for
// another round is told the run ended (a peer-gone kind).
func TestEndOfRun(t *testing.T) {
	o := Options{Group: "end", RunID: "e1", Rendezvous: "etcd://" + freeAddr(t), ServeRendezvous: true, BucketSize: 4 << 10, Timeout: 30 * time.Second}
	s, rs := ranks(t, 3, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := randomTensors(rand.New(rand.NewPCG(9, 9)), 5, 1<<10)
	send := func(ctx context.Context) error { _, err := s.Send(ctx, src, 1); return err }
	if err := syncRound(ctx, s, rs, send, []stages.Sink{sink.NewHostModel(), sink.NewHostModel()}); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = rs[0].AwaitEnd(ctx) })
	wg.Go(func() { _, errs[1] = rs[1].Receive(ctx, sink.NewHostModel()) })
	time.Sleep(100 * time.Millisecond) // let them wait; the end must reach them either way
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	wg.Wait()
	for _, r := range rs {
		r.Close() // the sender's group waits for them to leave
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil {
		t.Fatalf("AwaitEnd: %v", errs[0])
	}
	if KindOf(errs[1]) != KindPeerGone || !strings.Contains(errs[1].Error(), "ended the run") {
		t.Fatalf("a round after the end: %v (kind %d)", errs[1], KindOf(errs[1]))
	}
}

// lateExchange holds back the last receiver's publishing of its tcp
// address, as a rank on a loaded machine would be late to.
type lateExchange struct {
	transport.Exchange
	late  bool
	delay time.Duration
}

func (x lateExchange) Put(ctx context.Context, key string, value []byte) error {
	if x.late {
		select {
		case <-time.After(x.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return x.Exchange.Put(ctx, key, value)
}

// failingSource fails a round at once, as a trainer's bad tensor does.
type failingSource struct{ err error }

func (f failingSource) Tensors(context.Context, func(*stages.Tensor) error) error { return f.err }

// TestFirstRoundFailsWhileAReceiverOpens has rank 0's first round fail at
// once and rank 0 leave, while the last receiver is still opening its
// transport (late to publish its address, longer than rank 0 waits for
// the others when it leaves). No rank starts a round before every rank is
// open, so each receiver fails with the root's reason, not with a
// rendezvous that went away under it.
func TestFirstRoundFailsWhileAReceiverOpens(t *testing.T) {
	const world = 3
	testhook.Exchange = func(x transport.Exchange) transport.Exchange {
		g, _ := x.(interface{ Rank() int })
		return lateExchange{Exchange: x, late: g != nil && g.Rank() == world-1, delay: 6 * time.Second}
	}
	t.Cleanup(func() { testhook.Exchange = nil })
	addr := freeAddr(t)
	o := Options{Group: "late", RunID: "l1", Rendezvous: "etcd://" + addr, ServeRendezvous: true, BucketSize: 4 << 10,
		Device: "cpu", Transport: "tcp", Timeout: 20 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		o := o
		o.Rank, o.WorldSize = r, world
		wg.Go(func() {
			if r == 0 {
				s, err := OpenSender(ctx, o)
				if err != nil {
					errs[0] = err
					return
				}
				_, errs[0] = s.Send(ctx, failingSource{errors.New("tensor \"t.strided\" is not contiguous")}, 1)
				s.Close()
				return
			}
			o.ServeRendezvous = false
			rcv, err := OpenReceiver(ctx, o)
			if err != nil {
				errs[r] = err
				return
			}
			_, errs[r] = rcv.Receive(ctx, sink.NewHostModel())
			rcv.Close()
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "t.strided") {
			t.Errorf("rank %d: %v; want the root's reason", r, err)
		}
	}
}

// TestReceiveIntoHost receives rounds straight into host tensors handed
// in by address (numpy arrays from Python), over tcp: byte-identical to
// the sender's, in place across rounds; then a destination of another
// shape fails the round on every rank, naming the tensor.
func TestReceiveIntoHost(t *testing.T) {
	addr := freeAddr(t)
	o := Options{Group: "into", RunID: "i1", Rendezvous: "etcd://" + addr, ServeRendezvous: true, BucketSize: 8 << 10, Device: "cpu", Timeout: 30 * time.Second}
	s, rs := ranks(t, 3, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(5, 6))
	shape := randomTensors(rng, 40, 20<<10) // sizes from 0 to 2.5 buckets
	dsts := make([][]Ref, len(rs))
	for i := range rs {
		for _, tn := range shape {
			dsts[i] = append(dsts[i], Ref{Name: tn.Name, DType: tn.DType.String(), Shape: tn.Shape, Data: make([]byte, len(tn.Data))})
		}
	}
	into := func(ctx context.Context, version uint64, src source.Tensors) []error {
		return intoRound(ctx, rs, dsts, func(ctx context.Context) error { _, err := s.Send(ctx, src, version); return err })
	}
	for v := uint64(1); v <= 2; v++ {
		src := randomTensors(rng, 40, 20<<10)
		for i, tn := range src { // the same names, dtypes and shapes every round
			tn.Shape, tn.Data = shape[i].Shape, tn.Data[:0]
			for range len(shape[i].Data) {
				tn.Data = append(tn.Data, byte(rng.Uint32()))
			}
		}
		if err := errors.Join(into(ctx, v, src)...); err != nil {
			t.Fatalf("version %d: %v", v, err)
		}
		for i := range rs {
			for j, tn := range src {
				if !bytes.Equal(dsts[i][j].Data, tn.Data) {
					t.Fatalf("version %d, receiver %d: tensor %q differs", v, i+1, tn.Name)
				}
			}
		}
	}
	dsts[1][7].Shape = []int64{3, 1}
	dsts[1][7].Data = make([]byte, 12)
	errs := into(ctx, 3, shape)
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), `"layer.7"`) {
			t.Errorf("rank %d: %v; want the failure naming layer.7", r, err)
		}
	}
	if k := KindOf(errs[2]); k != KindConfig {
		t.Errorf("the receiver that had the wrong shape: kind %d for %v, want KindConfig", k, errs[2])
	}
}

// TestReceiveIntoRefused checks what ReceiveInto refuses before a round:
// each refusal names the tensor, and the round fails on every rank with
// it instead of leaving the others waiting.
func TestReceiveIntoRefused(t *testing.T) {
	cases := []struct {
		ref  Ref
		want string
	}{
		{Ref{Name: "s", DType: "F32", Shape: []int64{4}, Data: make([]byte, 16), Strided: true}, "not contiguous"},
		{Ref{Name: "d", DType: "F32", Shape: []int64{4}, Addr: 0x1000, Device: 0, Bytes: 16}, "host memory"},
		{Ref{Name: "b", DType: "F32", Shape: []int64{4}, Data: make([]byte, 15)}, "15 bytes"},
	}
	for i, c := range cases {
		t.Run(c.ref.Name, func(t *testing.T) {
			addr := freeAddr(t)
			o := Options{Group: "refused", RunID: fmt.Sprint("r", i), Rendezvous: "etcd://" + addr, ServeRendezvous: true, BucketSize: 8 << 10, Device: "cpu", Timeout: 30 * time.Second}
			s, rs := ranks(t, 2, o)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var serr error
			var wg sync.WaitGroup
			wg.Go(func() { _, serr = s.Send(ctx, randomTensors(rand.New(rand.NewPCG(1, 1)), 3, 1024), 1) })
			_, err := rs[0].ReceiveInto(ctx, []Ref{c.ref})
			wg.Wait()
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), fmt.Sprintf("%q", c.ref.Name)) || KindOf(err) != KindConfig {
				t.Fatalf("receiver: %v (kind %d); want KindConfig naming %q and saying %q", err, KindOf(err), c.ref.Name, c.want)
			}
			if serr == nil || !strings.Contains(serr.Error(), c.want) {
				t.Fatalf("sender: %v; want the receiver's reason", serr)
			}
		})
	}
}

// intoRound runs send and, on every receiver i, ReceiveInto(dsts[i]) at
// once, and returns each rank's error (rank 0's first).
func intoRound(ctx context.Context, rs []*Receiver, dsts [][]Ref, send func(context.Context) error) []error {
	errs := make([]error, len(rs)+1)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = send(ctx) })
	for i, r := range rs {
		wg.Go(func() { _, errs[i+1] = r.ReceiveInto(ctx, dsts[i]) })
	}
	wg.Wait()
	return errs
}

// TestCloseAfterTheRootLeft closes the receivers only after the root has
// closed, taking down the rendezvous it served: leaving cannot be confirmed
// then, and Close must not report that as a failure (a vLLM worker closed
// after its trainer, say).
func TestCloseAfterTheRootLeft(t *testing.T) {
	o := Options{Group: "late-close", RunID: "l1", Rendezvous: "etcd://" + freeAddr(t), ServeRendezvous: true, BucketSize: 4 << 10, Timeout: 30 * time.Second}
	s, rs := ranks(t, 3, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := randomTensors(rand.New(rand.NewPCG(3, 3)), 5, 1<<10)
	send := func(ctx context.Context) error { _, err := s.Send(ctx, src, 1); return err }
	if err := syncRound(ctx, s, rs, send, []stages.Sink{sink.NewHostModel(), sink.NewHostModel()}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // waits a bounded while for the receivers to leave, then goes
		t.Fatal(err)
	}
	for _, r := range rs {
		if err := r.Close(); err != nil {
			t.Errorf("rank %d: Close after the root ended the run: %v", r.Rank(), err)
		}
	}
}

// quittingExchange makes rank 1 fail its open, as a process that exits
// would, after a second of looking up its successor's address: before it
// ever connects to rank 2.
type quittingExchange struct{ transport.Exchange }

func (x quittingExchange) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	if rank != 2 || key != "tcp.addr" {
		return x.Exchange.Get(ctx, rank, key)
	}
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nil, errors.New("rank 1 exits before it connects to its successor")
}

// TestPredecessorGoneWhileOpening has rank 1 of a tcp chain leave before
// it connects to rank 2, which waits in accept for it: rank 2 ends within
// seconds of the rendezvous noticing, naming rank 1 as gone, not at its
// 30 s timeout.
func TestPredecessorGoneWhileOpening(t *testing.T) {
	const world = 3
	testhook.Exchange = func(x transport.Exchange) transport.Exchange {
		if g, _ := x.(interface{ Rank() int }); g != nil && g.Rank() == 1 {
			return quittingExchange{x}
		}
		return x
	}
	t.Cleanup(func() { testhook.Exchange = nil })
	o := Options{Group: "quit", RunID: "q1", Rendezvous: "etcd://" + freeAddr(t), ServeRendezvous: true, BucketSize: 4 << 10,
		Device: "cpu", Transport: "tcp", Timeout: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, world)
	took := make([]time.Duration, world)
	start := time.Now()
	var wg sync.WaitGroup
	for r := range world {
		o := o
		o.Rank, o.WorldSize = r, world
		wg.Go(func() {
			defer func() { took[r] = time.Since(start) }()
			if r == 0 {
				s, err := OpenSender(ctx, o)
				if err == nil {
					s.Close()
				}
				errs[0] = err
				return
			}
			o.ServeRendezvous = false
			rcv, err := OpenReceiver(ctx, o)
			if err == nil {
				rcv.Close()
			}
			errs[r] = err
		})
	}
	wg.Wait()
	for r, err := range errs {
		t.Logf("rank %d after %v: %v", r, took[r].Round(time.Millisecond), err)
	}
	var gone *rendezvous.Error
	switch err := errs[2]; {
	case err == nil:
		t.Fatal("rank 2 opened without its predecessor")
	case took[2] > 15*time.Second:
		t.Errorf("rank 2 took %v to give up on rank 1, which had left (timeout 30 s)", took[2])
	case KindOf(err) != KindPeerGone || !errors.As(err, &gone) || !slices.Contains(gone.Ranks, 1):
		t.Errorf("rank 2: %v (kind %d); want rank 1 named as gone", err, KindOf(err))
	}
}

// TestWaitNotices opens rank 0 of 2 alone: while it waits for rank 1, it
// says so through Options.Logger (every rendezvous.NoticeEvery), naming
// who it waits for and who has joined, then times out.
func TestWaitNotices(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	o := Options{Group: "notices", RunID: "n1", Rendezvous: "etcd://" + freeAddr(t), ServeRendezvous: true, BucketSize: 4 << 10,
		Device: "cpu", Transport: "tcp", Timeout: rendezvous.NoticeEvery + 2*time.Second, Rank: 0, WorldSize: 2,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))}
	s, err := OpenSender(context.Background(), o)
	if err == nil {
		s.Close()
		t.Fatal("rank 0 opened without rank 1")
	}
	if KindOf(err) != KindTimeout {
		t.Errorf("rank 0 alone: %v; want a timeout", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := logs.String(); !strings.Contains(got, "waiting for rank 1 to join (1 of 2 joined), ") {
		t.Fatalf("rank 0 said %q while it waited; want who it waits for and who joined", got)
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestFieldErrors: every setting that cannot work is a *FieldError that
// names its JSON key and matches ErrConfig, and a front end can spell the
// field its own way.
func TestFieldErrors(t *testing.T) {
	base := Options{Rendezvous: "etcd://127.0.0.1:1", RunID: "r", WorldSize: 2}
	for _, c := range []struct {
		field string
		mod   func(*Options)
	}{
		{"bucket", func(o *Options) { o.BucketSize = 100 }},
		{"bucket", func(o *Options) { o.BucketSize = 2 << 40 }},
		{"timeout", func(o *Options) { o.Timeout = -time.Second }},
		{"group", func(o *Options) { o.Group = "a/b" }},
		{"run_id", func(o *Options) { o.RunID = "owner" }},
		{"transport", func(o *Options) { o.Transport = "udp" }},
		{"device", func(o *Options) { o.Device = "tpu" }},
		{"world_size", func(o *Options) { o.WorldSize = 1 }},
		{"rank", func(o *Options) { o.Rank = 1 }},
		{"rendezvous", func(o *Options) { o.Rendezvous = "h:1" }},
		{"secret_file", func(o *Options) { o.SecretFile = "/nonexistent/secret" }},
		{"bucket_mac", func(o *Options) { o.BucketMAC = "hmac" }},
		{"bucket_mac", func(o *Options) { o.BucketMAC, o.Senders = mac.Poly1305AES, 1 }},
	} {
		o := base
		c.mod(&o)
		err := o.check("sender")
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v; want a FieldError of %q", c.field, err, c.field)
			continue
		}
		if !strings.HasSuffix(err.Error(), c.field+" "+fe.Value+fe.Problem) && !strings.HasSuffix(err.Error(), c.field+fe.Problem) {
			t.Errorf("%s: %q does not end with the field's own text %q", c.field, err, fe.Error())
		}
		if s := fe.Spelled("--x", " "); !errors.Is(s, ErrConfig) || !errors.As(s, new(*FieldError)) || !strings.HasPrefix(s.Error(), "--x") {
			t.Errorf("%s spelled: %v", c.field, s)
		}
	}
	o := Options{BucketSize: 100}
	var fe *FieldError
	if err := o.Validate(); !errors.As(err, &fe) || fe.Spell("bucket", "=") != "bucket=100 is below the minimum of 1.0 KiB (a few hundred MiB is usual)" {
		t.Errorf("bucket=: %v", err)
	}
	o = Options{}
	if err := o.Validate(); err != nil || o.Group != DefaultGroup || o.BucketSize != DefaultBucketSize || o.Timeout != DefaultTimeout || o.Transport != "auto" {
		t.Errorf("defaults: %+v, %v", o, err)
	}
}
