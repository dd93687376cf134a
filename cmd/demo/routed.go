package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/route"
	"github.com/weightcast/weightcast/stages"
)

// A routed run (--senders, --tp) has ranks 0..S-1 send, each its dim-0
// shard of every tensor of the round's model (as FSDP holds a model), and
// the other ranks receive, grouped into replicas of --tp ranks, each only
// its tensor-parallel shard under the default rules, on a plan every rank
// makes once (package route).

// routed reports whether the run is a routed one.
func (c *config) routed() bool { return c.senders > 0 }

// sends reports whether rank sends.
func (c *config) sends(rank int) bool {
	if c.routed() {
		return rank < c.senders
	}
	return rank == 0
}

// receivers counts the receiving ranks.
func (c *config) receivers() int {
	if c.routed() {
		return c.ranks - c.senders
	}
	return c.ranks - 1
}

// checkRouted checks --senders and --tp against the rest of the run.
func (c *config) checkRouted() error {
	if c.tp < 1 {
		return fmt.Errorf("--tp %d: give the receivers' tensor-parallel size, 1 or more", c.tp)
	}
	if c.tp > 1 && c.senders == 0 {
		c.senders = 1
	}
	if !c.routed() {
		if c.senders < 0 {
			return fmt.Errorf("--senders %d: give 0 (rank 0 broadcasts) or the number of sending ranks", c.senders)
		}
		return nil
	}
	recv := c.ranks - c.senders
	switch {
	case recv < 1:
		return fmt.Errorf("--senders %d of --ranks %d leaves no receiver: --ranks counts senders and receivers together", c.senders, c.ranks)
	case recv%c.tp != 0:
		return fmt.Errorf("--tp %d: the %d receivers (--ranks %d less --senders %d) do not form replicas of %d ranks", c.tp, recv, c.ranks, c.senders, c.tp)
	case c.quantize.Scheme != quant.None:
		return fmt.Errorf("--quantize with --senders: routed rounds send the weights as they are; leave one of them out")
	case c.out != "":
		return fmt.Errorf("--out with --senders: routed receivers keep their shards in memory; leave one of them out")
	case inProcess(c.transport):
		return fmt.Errorf("--transport inproc with --senders: a routed group needs a transport with point-to-point buckets (tcp)")
	}
	return nil
}

// syntheticRules say how the synthetic model's tensors that no Hugging
// Face model has are split: replicated.
var syntheticRules = []string{`\.self_attn\.qkv_bias\.\d+$=replicated`, `^model\.rotary_emb\.unused_cache$=replicated`}

// routedOptions fills a routed rank's own settings: its TP place and the
// model's head counts.
func (c *config) routedOptions(o *weightcast.Options) error {
	if !c.routed() || c.sends(o.Rank) {
		return nil
	}
	o.TP, o.TPRank = c.tp, (o.Rank-c.senders)%c.tp
	if c.modelPath == "" {
		// The synthetic model: a head per TP rank, and its one-dimensional
		// attention biases replicated.
		o.Heads, o.KVHeads = c.tp, c.tp
		o.TPRules = syntheticRules
		return nil
	}
	{
		dir := c.modelPath
		if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
			dir = filepath.Dir(dir)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil {
			hf, err := layout.ParseHFConfig(b)
			if err != nil {
				return fmt.Errorf("--model %s: %w", c.modelPath, err)
			}
			m := hf.Model()
			o.Heads, o.KVHeads = m.Heads, m.KVHeads
		}
	}
	return nil
}

// sendRoutedRounds sends every round's dim-0 shard of this sender: from
// host memory, or, when its buckets are on a GPU, from copies of the shard
// on that GPU, as a trainer holds its weights there.
func sendRoutedRounds(ctx context.Context, c *config, sender *weightcast.Sender, cuda *gpu.CUDADevice, prog *progress, res *rankResult) error {
	defer func() { res.CommittedVersion = sender.Committed() }()
	var onGPU *gpuShards
	if cuda != nil {
		var err error
		if onGPU, err = newGPUShards(cuda); err != nil {
			return err
		}
		defer onGPU.close()
	}
	for round := 1; round <= c.rounds; round++ {
		m, err := c.model(round)
		if err != nil {
			return err
		}
		shards, err := route.Dim0(ctx, m, sender.Rank(), c.senders)
		if err != nil {
			return err
		}
		if onGPU != nil {
			if shards, err = onGPU.upload(ctx, shards); err != nil {
				return fmt.Errorf("round %d: writing the shards to %s: %w", round, cuda.Name(), err)
			}
		}
		st, err := sender.SendShards(ctx, shards, uint64(round))
		if err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		res.addRouted(st)
		if prog.report != nil && sender.Rank() == 0 {
			prog.report(event{Type: "round", Rank: 0, Round: round, Bytes: st.BytesSent, Total: m.Size(), Elapsed: (st.Duration - st.Waited).Seconds()})
		}
	}
	res.Verified = c.verify
	return nil
}

// receiveRoutedRounds receives every round's shard (into the receiver's
// GPU when its buckets are there) and, with --verify, compares each local
// tensor with the slice of the round's model it is.
func receiveRoutedRounds(ctx context.Context, c *config, receiver *weightcast.Receiver, cuda *gpu.CUDADevice, res *rankResult) error {
	defer func() { res.CommittedVersion = receiver.Committed() }()
	dest := &route.Shards{}
	var read *gpu.Stream
	if cuda != nil {
		dest.Device = cuda
		var err error
		if read, err = cuda.NewStream(); err != nil {
			return err
		}
		defer read.Close()
	}
	defer dest.Close()
	var want int64
	for round := 1; round <= c.rounds; round++ {
		m, err := c.model(round)
		if err != nil {
			return err
		}
		st, err := receiver.ReceiveShards(ctx, dest)
		if err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		if st.Version != uint64(round) {
			return fmt.Errorf("round %d: received model version %d", round, st.Version)
		}
		res.addRouted(st)
		want += st.BytesReceived
		if c.verify {
			n, err := verifyShards(ctx, m, dest.All(), read)
			if err != nil {
				return fmt.Errorf("round %d: %w", round, err)
			}
			res.Checked += n
			res.VerifyScope = "every round, each shard against its slice of the model"
		}
	}
	if c.verify {
		res.Verified = res.Checked == want && want > 0
		if !res.Verified {
			return fmt.Errorf("verified %d bytes, received %d", res.Checked, want)
		}
	}
	return nil
}

// verifyShards compares each received shard with its slice of m (read
// back on read when it is on a GPU) and returns the bytes compared.
func verifyShards(ctx context.Context, m stages.Lookuper, got []route.Received, read *gpu.Stream) (int64, error) {
	var n int64
	for _, r := range got {
		data := r.Data
		if data == nil {
			data = make([]byte, r.Slice.Elements()*int64(r.Tensor.DType.Size()))
			if len(data) > 0 {
				if err := read.CopyDtoH(data, r.Buffer, 0); err != nil {
					return n, err
				}
				if err := read.Sync(ctx); err != nil {
					return n, err
				}
			}
		}
		t, ok := m.Lookup(r.Tensor.Name)
		if !ok {
			return n, fmt.Errorf("received tensor %s, which the model does not have", r.Tensor.Name)
		}
		size, err := t.Size()
		if err != nil {
			return n, err
		}
		full := make([]byte, size)
		if err := t.ReadAt(full, 0); err != nil {
			return n, err
		}
		if !bytes.Equal(data, route.Region(r.Tensor, r.Slice, full)) {
			return n, fmt.Errorf("tensor %s %v differs from its slice of the model", r.Tensor.Name, r.Slice)
		}
		n += int64(len(data))
	}
	return n, nil
}

// addRouted records a routed round.
func (res *rankResult) addRouted(st route.Stats) {
	// A round's seconds count from the moment every rank was in it (a
	// sender that prepares its shards late is not the transfer's time):
	// route.Stats.Waited is left out, and reported.
	res.Rounds = append(res.Rounds, roundResult{Version: st.Version, Seconds: (st.Duration - st.Waited).Seconds(), Waited: st.Waited.Seconds(), Bytes: st.BytesSent + st.BytesReceived,
		Buckets: st.Buckets, Stages: stageResults(st.Stages), BytesSent: st.BytesSent, BytesReceived: st.BytesReceived})
	res.BytesSent += st.BytesSent
	res.BytesReceived += st.BytesReceived
	res.Plan, res.PlanBalance = st.Plan, st.Balance
}

// gpuShards keeps a sender's shards on its GPU across rounds: one
// allocation per shard, written again every round.
type gpuShards struct {
	dev  *gpu.CUDADevice
	s    *gpu.Stream
	bufs map[string]mem.Buffer
}

func newGPUShards(d *gpu.CUDADevice) (*gpuShards, error) {
	s, err := d.NewStream()
	if err != nil {
		return nil, err
	}
	return &gpuShards{dev: d, s: s, bufs: map[string]mem.Buffer{}}, nil
}

// upload writes each shard's bytes to its device buffer and returns the
// shards as device memory.
func (g *gpuShards) upload(ctx context.Context, shards []route.Local) ([]route.Local, error) {
	out := make([]route.Local, len(shards))
	for i, l := range shards {
		b, ok := g.bufs[l.Name]
		if !ok || b.Len() < max(len(l.Data), 1) {
			var err error
			if b, err = g.dev.Alloc(max(len(l.Data), 1)); err != nil {
				return nil, err
			}
			g.bufs[l.Name] = b
		}
		if len(l.Data) > 0 {
			if err := g.s.CopyHtoD(b, 0, l.Data); err != nil {
				return nil, err
			}
		}
		out[i] = route.Local{Shard: l.Shard, Buffer: b}
	}
	return out, g.s.Sync(ctx)
}

func (g *gpuShards) close() {
	for _, b := range g.bufs {
		b.Free()
	}
	g.s.Close()
}
