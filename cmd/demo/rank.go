package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// event is one line a rank reports: progress while it runs, its result at
// the end. Rank processes write them to stdout as JSON lines.
type event struct {
	Type    string      `json:"type"` // "progress", "round" or "result"
	Rank    int         `json:"rank"`
	Round   int         `json:"round,omitempty"`
	Bytes   int64       `json:"bytes,omitempty"`
	Total   int64       `json:"total,omitempty"`
	Elapsed float64     `json:"elapsed,omitempty"`
	Result  *rankResult `json:"result,omitempty"`
}

// rankResult is what one rank reports about its run.
type rankResult struct {
	Rank     int           `json:"rank"`
	Role     string        `json:"role"`
	Host     string        `json:"host"`
	PID      int           `json:"pid"`
	Device   string        `json:"device"`
	Rounds   []roundResult `json:"rounds"`
	Verified bool          `json:"verified"`
	Checked  int64         `json:"verified_bytes"`
	// VerifyScope says what was compared: "every round" (host buckets,
	// checked as they arrive) or "final round" (a GPU model read back).
	VerifyScope string `json:"verified_scope,omitempty"`
	MaxBuffers  int    `json:"max_buffers"`
	PeakRSS     int64  `json:"peak_rss_bytes,omitempty"`
	// GPUMemory is the device memory the rank held at its peak, from the
	// driver's free-memory figure: buckets, its model, and the transport's
	// own. Only measured when the rank has its GPU to itself (nccl); ranks
	// sharing a GPU report GPUBuffers, what they allocated themselves.
	GPUMemory  int64 `json:"gpu_memory_bytes,omitempty"`
	GPUBuffers int64 `json:"gpu_buffers_bytes,omitempty"`
	// MPS says whether the rank's GPU context is shared through the CUDA
	// Multi-Process Service (gpu.CUDADevice.MPS).
	MPS bool `json:"mps,omitempty"`
	// CommittedVersion is the last model version committed on every
	// receiver, as this rank saw it (0: none).
	CommittedVersion uint64 `json:"committed_version"`
	// BytesSent and BytesReceived add up the rank's routed rounds
	// (--senders); Plan is the plan's digest and PlanBalance its busiest
	// sender's bytes over the mean.
	BytesSent     int64   `json:"bytes_sent,omitempty"`
	BytesReceived int64   `json:"bytes_received,omitempty"`
	Plan          string  `json:"plan,omitempty"`
	PlanBalance   float64 `json:"plan_balance,omitempty"`
	// State says, on a receiver that failed, what its model holds:
	// "intact" (the committed version) or "partial (resync needed)".
	State string `json:"state,omitempty"`
	Error string `json:"error,omitempty"`
	// Stopped says what stopped the rank before its last round: a
	// signal ("SIGINT", "SIGTERM") or "launcher gone". Error then holds
	// how its round ended.
	Stopped string `json:"stopped,omitempty"`
	// Unreported is set by a launcher for a rank process that ended
	// without reporting (killed, crashed): only Rank and Error are known.
	Unreported bool `json:"unreported,omitempty"`
}

type roundResult struct {
	Version uint64  `json:"version"`
	Seconds float64 `json:"seconds"`
	Bytes   int64   `json:"bytes"`
	Buckets int     `json:"buckets"`
	// Direct counts, on the sender, the buckets its receivers read in
	// place in its memory (--direct).
	Direct int `json:"direct_buckets,omitempty"`
	// TurnBuckets is, on the sender, how many buckets each receiver
	// copied per turn (--turns); absent where they took no turns.
	TurnBuckets int           `json:"turn_buckets,omitempty"`
	Tensors     int           `json:"tensors"`
	Stages      []stageResult `json:"stages"`
	// BytesSent and BytesReceived are a routed round's payload bytes
	// (--senders): what the plan gave this rank.
	BytesSent     int64 `json:"bytes_sent,omitempty"`
	BytesReceived int64 `json:"bytes_received,omitempty"`
	// Waited is the time a routed rank waited for the others to begin
	// the round, which Seconds leaves out.
	Waited float64 `json:"waited_seconds,omitempty"`
}

type stageResult struct {
	Stage      string  `json:"stage"`
	Items      int64   `json:"items"`
	Bytes      int64   `json:"bytes"`
	Busy       float64 `json:"busy_seconds"`
	WaitIn     float64 `json:"wait_in_seconds"`
	BlockedOut float64 `json:"blocked_out_seconds"`
}

func stageResults(ms []pipeline.Metrics) []stageResult {
	out := make([]stageResult, len(ms))
	for i, m := range ms {
		out[i] = stageResult{Stage: m.Stage, Items: max(m.ItemsIn, m.ItemsOut), Bytes: m.Bytes,
			Busy: m.Busy.Seconds(), WaitIn: m.WaitIn.Seconds(), BlockedOut: m.BlockedOut.Seconds()}
	}
	return out
}

// runRank opens one rank of the run through the library's front door
// (package weightcast: rendezvous, join, lost-peer watch, device, bus,
// transport, pool), runs every round on it and closes it. It reports
// progress through report (rank 0 only) and returns the rank's result.
// Each round carries a new model version: the same layout with new bytes
// (seed + round), as a training step changes every weight.
func runRank(ctx context.Context, c *config, o weightcast.Options, tracer *pipeline.Tracer, report func(event)) (res *rankResult, err error) {
	host, _ := os.Hostname()
	res = &rankResult{Rank: o.Rank, Role: "receiver", Host: host, PID: os.Getpid()}
	if c.sends(o.Rank) {
		res.Role = "sender"
	}
	if err := c.routedOptions(&o); err != nil {
		return res, err
	}
	layout, err := c.model(0)
	if err != nil {
		return res, err
	}
	gauge := newGPUGauge(o)
	defer gauge.close()
	prog := &progress{report: report, total: layout.Size()}
	o.Tracer = tracer
	var m interface {
		Device() mem.Device
		MaxBuffers() int
		Close() error
	}
	var sender *weightcast.Sender
	var receiver *weightcast.Receiver
	if c.sends(o.Rank) {
		o.Progress = prog.bucket
		o.Quantize = c.quantize
		sender, err = weightcast.OpenSender(ctx, o)
		m = sender
	} else {
		receiver, err = weightcast.OpenReceiver(ctx, o)
		m = receiver
	}
	if err != nil {
		return res, err
	}
	defer func() {
		res.MaxBuffers = m.MaxBuffers()
		if cerr := m.Close(); cerr != nil && res.Error == "" {
			res.Error = cerr.Error()
		}
	}()
	dev := m.Device()
	res.Device = dev.Name()
	if tracer != nil {
		tracer.NameProcess(o.Rank, fmt.Sprintf("rank %d (%s, %s)", o.Rank, res.Role, dev.Name()))
	}
	cuda, onGPU := dev.(*gpu.CUDADevice)
	if onGPU {
		res.MPS = cuda.MPS()
		res.GPUBuffers = int64(stages.DefaultBuffers)*c.bucket + layout.Size() // buckets and the model copy
	}
	gpuMemory := func() { gauge.measure(res) }
	switch {
	case c.routed() && sender != nil:
		err = sendRoutedRounds(ctx, c, sender, cuda, prog, res)
	case c.routed():
		err = receiveRoutedRounds(ctx, c, receiver, cuda, res)
	case o.Rank == 0:
		err = sendRounds(ctx, c, sender, cuda, layout, prog, res, gpuMemory)
	default:
		err = receiveRounds(ctx, c, receiver, cuda, res, gpuMemory)
	}
	// The run ends as docs/protocol.md says: once every receiver has
	// acknowledged the last commit, rank 0 closes its metadata bus (BYE,
	// when its Sender closes, deferred above) and its group waits for the
	// others to leave.
	return res, err
}

// progress reports the bytes of the sender's round as its buckets move.
type progress struct {
	report func(event)
	total  int64
	round  int
	start  time.Time
	sent   int64
}

func (p *progress) bucket(m *wire.BucketMeta) {
	p.sent += m.Length
	if p.report != nil {
		p.report(event{Type: "progress", Rank: 0, Round: p.round, Bytes: p.sent, Total: p.total, Elapsed: time.Since(p.start).Seconds()})
	}
}

// gpuGauge measures the device memory a rank holds at its peak, from the
// driver's free-memory figure: buckets, its model, and the transport's
// own. Only when the rank has its GPU to itself (nccl); it reads the free
// memory before the rank opens anything.
type gpuGauge struct {
	dev    *gpu.CUDADevice
	before uint64
}

func newGPUGauge(o weightcast.Options) *gpuGauge {
	g := &gpuGauge{}
	var ordinal int
	if d, _ := transport.Lookup(o.Transport); !d.GPUPerRank || !strings.HasPrefix(o.Device, "cuda:") {
		return g
	}
	if _, err := fmt.Sscanf(o.Device, "cuda:%d", &ordinal); err != nil {
		return g
	}
	if d, err := gpu.NewCUDADevice(ordinal); err == nil {
		g.dev = d
		g.before, _, _ = d.MemInfo()
	}
	return g
}

func (g *gpuGauge) measure(res *rankResult) {
	if g.dev == nil {
		return
	}
	if free, _, err := g.dev.MemInfo(); err == nil && g.before > free {
		res.GPUMemory = max(res.GPUMemory, int64(g.before-free))
	}
}

func (g *gpuGauge) close() {
	if g.dev != nil {
		g.dev.Close()
	}
}

func sendRounds(ctx context.Context, c *config, sender *weightcast.Sender, cuda *gpu.CUDADevice, layout model,
	prog *progress, res *rankResult, gpuMemory func()) error {
	report := prog.report
	var onDevice *deviceModel
	if cuda != nil && c.modelPath == "" {
		var err error
		if onDevice, err = newDeviceModel(cuda, layout); err != nil {
			return err
		}
		defer onDevice.close()
	}
	defer func() { res.CommittedVersion = sender.Committed() }()
	for round := 1; round <= c.rounds; round++ {
		model, err := c.model(round)
		if err != nil {
			return err
		}
		var src stages.Source = model
		if onDevice != nil {
			// The trainer's new weights are on its GPU before the sync.
			if err := onDevice.fill(ctx, model); err != nil {
				return fmt.Errorf("round %d: writing the model to %s: %w", round, cuda.Name(), err)
			}
			src = onDevice.tensors
		}
		prog.round, prog.start, prog.sent = round, time.Now(), 0
		st, err := sender.Send(ctx, src, uint64(round))
		gpuMemory()
		if err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		res.Rounds = append(res.Rounds, roundResult{Version: st.Version, Seconds: st.Duration.Seconds(), Bytes: st.Bytes, Buckets: st.Buckets, Direct: st.Direct, TurnBuckets: st.TurnBuckets, Tensors: st.Tensors, Stages: stageResults(st.Stages)})
		if report != nil {
			report(event{Type: "round", Rank: 0, Round: round, Bytes: st.Bytes, Total: layout.Size(), Elapsed: st.Duration.Seconds()})
		}
	}
	res.Verified = c.verify
	return nil
}

func receiveRounds(ctx context.Context, c *config, receiver *weightcast.Receiver, cuda *gpu.CUDADevice,
	res *rankResult, gpuMemory func()) (err error) {
	rank := receiver.Rank()
	defer func() {
		res.CommittedVersion = receiver.Committed()
		if err != nil {
			res.State = receiver.State().String()
		}
	}()
	var onDevice *sink.DeviceModel
	if cuda != nil {
		// A rollout worker's weights live on its GPU: allocated in the
		// first round, updated in place after.
		var err error
		if onDevice, err = sink.NewDeviceModel(cuda); err != nil {
			return err
		}
		defer onDevice.Close()
	}
	var want int64
	for round := 1; round <= c.rounds; round++ {
		model, err := c.model(round)
		if err != nil {
			return err
		}
		want1, want1Size, err := c.expected(ctx, model)
		if err != nil {
			return err
		}
		var into stages.Sink = &discard{}
		var verify *sink.Verifier
		var sinks []stages.Sink
		if c.verify && (onDevice == nil || c.out != "") {
			verify = sink.Verify(want1)
			sinks = append(sinks, verify)
		}
		if c.out != "" {
			// Written from host memory; device buckets are copied out first.
			sinks = append(sinks, sink.WriteSafetensors(c.outDir(rank), c.modelConfig()))
		}
		switch {
		case len(sinks) == 1:
			into = sinks[0]
		case len(sinks) > 1:
			into = stages.Sinks(sinks...) // each keeps what it can do: a verifier holds nothing, the files are shadowed
		case onDevice != nil:
			into = onDevice
		}
		st, err := receiver.Receive(ctx, into)
		gpuMemory()
		if err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		if st.Version != uint64(round) {
			return fmt.Errorf("round %d: received model version %d", round, st.Version)
		}
		res.Rounds = append(res.Rounds, roundResult{Version: st.Version, Seconds: st.Duration.Seconds(), Bytes: st.Bytes, Buckets: st.Buckets, Direct: st.Direct, TurnBuckets: st.TurnBuckets, Tensors: st.Tensors, Stages: stageResults(st.Stages)})
		if verify != nil {
			res.Checked += verify.Bytes
			want += want1Size
			res.VerifyScope = "every round"
		}
		if onDevice != nil && into == stages.Sink(onDevice) && c.verify && round == c.rounds {
			// Reading a GPU model back costs far more than receiving it,
			// so the device path checks the final version: every tensor,
			// byte for byte, against the last round's bytes.
			vs, err := onDevice.Verify(ctx, want1)
			if err != nil {
				return fmt.Errorf("verifying version %d on %s: %w", round, cuda.Name(), err)
			}
			res.Checked, want = vs.Bytes, want1Size
			res.VerifyScope = "final round, read back from the GPU"
		}
	}
	if c.verify {
		res.Verified = res.Checked == want && want > 0
		if !res.Verified {
			return fmt.Errorf("verified %d bytes, expected %d", res.Checked, want)
		}
	}
	return nil
}

// discard is the sink used without --verify: it only counts bytes.
type discard struct{ bytes int64 }

func (d *discard) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	d.bytes += int64(len(data))
	return nil
}

func (d *discard) Commit(ctx context.Context, version uint64) error { return nil }

// Holding is HoldsNothing: discard keeps no model.
func (d *discard) Holding() stages.Holding { return stages.HoldsNothing }

// peakRSS reads the process's peak resident set size (Linux VmHWM).
func peakRSS() int64 { return procKiB("/proc/self/status", "VmHWM:") }

// errString is err's text, or "".
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
