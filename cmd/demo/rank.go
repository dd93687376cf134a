package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
)

// links are the connections one rank uses: its byte transport endpoint and
// either the metadata publisher (rank 0) or a subscriber.
type links struct {
	endpoint  transport.Endpoint
	publisher transport.Publisher
	sub       transport.Subscriber
}

func (l *links) close() {
	if l.publisher != nil {
		l.publisher.Close()
	}
	if l.sub != nil {
		l.sub.Close()
	}
	if l.endpoint != nil {
		l.endpoint.Close()
	}
}

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
	Rank       int           `json:"rank"`
	Role       string        `json:"role"`
	Host       string        `json:"host"`
	PID        int           `json:"pid"`
	Device     string        `json:"device"`
	Rounds     []roundResult `json:"rounds"`
	Verified   bool          `json:"verified"`
	Checked    int64         `json:"verified_bytes"`
	MaxBuffers int           `json:"max_buffers"`
	PeakRSS    int64         `json:"peak_rss_bytes,omitempty"`
	GPUMemory  int64         `json:"gpu_memory_bytes,omitempty"`
	Error      string        `json:"error,omitempty"`
}

type roundResult struct {
	Version uint64        `json:"version"`
	Seconds float64       `json:"seconds"`
	Bytes   int64         `json:"bytes"`
	Buckets int           `json:"buckets"`
	Tensors int           `json:"tensors"`
	Stages  []stageResult `json:"stages"`
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

// runRank runs every round on one rank. It reports progress through report
// (rank 0 only) and returns the rank's result; ctx carries the run's
// cancellation (a lost peer cancels it with the cause).
func runRank(ctx context.Context, c *config, rank int, l *links, dev gpu.Device, tracer *pipeline.Tracer, report func(event)) (*rankResult, error) {
	host, _ := os.Hostname()
	res := &rankResult{Rank: rank, Role: "receiver", Host: host, PID: os.Getpid(), Device: dev.Name()}
	if rank == 0 {
		res.Role = "sender"
	}
	if tracer != nil {
		tracer.NameProcess(rank, fmt.Sprintf("rank %d (%s)", rank, res.Role))
	}
	model, err := c.model()
	if err != nil {
		return res, err
	}
	pool, err := stages.NewPool(dev, stages.DefaultBuffers, int(c.bucket))
	if err != nil {
		return res, err
	}
	defer func() {
		res.MaxBuffers = pool.MaxHeld()
		if err := pool.Close(); err != nil && res.Error == "" {
			res.Error = err.Error()
		}
	}()

	if rank == 0 {
		var round int
		var start time.Time
		var sent int64
		sender := stages.NewSender(stages.SenderConfig{
			Endpoint: l.endpoint, Publisher: l.publisher, Pool: pool, Checksum: true, Tracer: tracer, Rank: 0,
			Progress: func(m *stages.BucketMeta) {
				sent += m.Length
				if report != nil {
					report(event{Type: "progress", Rank: 0, Round: round, Bytes: sent, Total: model.Size(), Elapsed: time.Since(start).Seconds()})
				}
			},
		})
		for round = 1; round <= c.rounds; round++ {
			start, sent = time.Now(), 0
			st, err := sender.Sync(ctx, model, uint64(round))
			if err != nil {
				return res, fmt.Errorf("round %d: %w", round, err)
			}
			res.Rounds = append(res.Rounds, roundResult{Version: st.Version, Seconds: st.Duration.Seconds(), Bytes: st.Bytes, Buckets: st.Buckets, Tensors: st.Tensors, Stages: stageResults(st.Stages)})
			if report != nil {
				report(event{Type: "round", Rank: 0, Round: round, Bytes: st.Bytes, Total: model.Size(), Elapsed: st.Duration.Seconds()})
			}
		}
		res.Verified = c.verify
		return res, nil
	}

	receiver := stages.NewReceiver(stages.ReceiverConfig{Endpoint: l.endpoint, Subscriber: l.sub, Pool: pool, Tracer: tracer, Rank: rank})
	var sink stages.Sink = &discard{}
	var verify *stages.VerifySink
	if c.verify {
		verify = stages.Verify(model)
		sink = verify
	}
	for round := 1; round <= c.rounds; round++ {
		st, err := receiver.Sync(ctx, sink)
		if err != nil {
			return res, fmt.Errorf("round %d: %w", round, err)
		}
		if st.Version != uint64(round) {
			return res, fmt.Errorf("round %d: received model version %d", round, st.Version)
		}
		res.Rounds = append(res.Rounds, roundResult{Version: st.Version, Seconds: st.Duration.Seconds(), Bytes: st.Bytes, Buckets: st.Buckets, Tensors: st.Tensors, Stages: stageResults(st.Stages)})
	}
	if verify != nil {
		res.Verified = verify.Bytes == int64(c.rounds)*model.Size()
		res.Checked = verify.Bytes
		if !res.Verified {
			return res, fmt.Errorf("verified %d bytes, expected %d", verify.Bytes, int64(c.rounds)*model.Size())
		}
	}
	return res, nil
}

func (c *config) model() (*stages.SyntheticModel, error) {
	return stages.Synthetic{Size: c.size, Tensors: c.tensors, DTypes: c.dtypes, Seed: c.seed}.Model()
}

// discard is the sink used without --verify: it only counts bytes.
type discard struct{ bytes int64 }

func (d *discard) Load(ctx context.Context, e *stages.Entry, data []byte) error {
	d.bytes += int64(len(data))
	return nil
}

func (d *discard) Commit(ctx context.Context, version uint64) error { return nil }

// peakRSS reads the process's peak resident set size (Linux VmHWM).
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}

// errString is err's text, or "".
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
