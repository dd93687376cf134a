package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/pflag"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/plan"
)

// planUsage heads `demo plan --help`.
const planUsage = `demo plan: plan a weight update from sharded trainer GPUs to sharded rollout
GPUs, on paper: no rank starts, nothing is sent.

Usage:
  demo plan --config config.json [flags]

It reads a Hugging Face config.json, lists the model's tensors, lays them out
over the trainer (FSDP along dim 0, optionally inside TP/EP groups) and the
rollout (replicas of TP/EP shards under vLLM's rules), plans which trainer GPU
sends which bytes to which rollout GPU, and prints the plan's predicted time
and its lower bound on the link model.

Flags:
`

// planFlags are demo plan's settings.
type planFlags struct {
	config                                    string
	dtype                                     string
	trainerRanks, trainerFSDP, trainerTP, tEP int
	replicas, tp, ep                          int
	nic, nvlink                               string
	gpusPerNode                               int
	latency                                   time.Duration
	colocated                                 bool
	rules                                     []string
	json                                      bool
}

func planFlagSet(f *planFlags) *pflag.FlagSet {
	fs := pflag.NewFlagSet("demo plan", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	fs.StringVar(&f.config, "config", "", "the model's Hugging Face `config.json` (required)")
	fs.StringVar(&f.dtype, "dtype", "bf16", "the dtype the bytes travel in: bf16, f16, f32, or fp8 (FP8 codes; the block scales, under 0.1%, left out)")
	fs.IntVar(&f.trainerRanks, "trainer-ranks", 256, "trainer GPUs (the senders)")
	fs.IntVar(&f.trainerFSDP, "trainer-fsdp", 0, "FSDP shards of the trainer (default: trainer-ranks over the TP/EP group)")
	fs.IntVar(&f.trainerTP, "trainer-tp", 1, "the trainer's tensor-parallel size")
	fs.IntVar(&f.tEP, "trainer-ep", 1, "the trainer's expert-parallel size")
	fs.IntVar(&f.replicas, "replicas", 16, "rollout replicas")
	fs.IntVar(&f.tp, "tp", 8, "the rollout's tensor-parallel size")
	fs.IntVar(&f.ep, "ep", 1, "the rollout's expert-parallel size (a replica then has max(tp, ep) GPUs, attention TP within it)")
	fs.StringVar(&f.nic, "nic", "400Gb/s", "each GPU's NIC, each direction (Gb/s in bits, GB/s in bytes)")
	fs.StringVar(&f.nvlink, "nvlink", "450GB/s", "each GPU's NVLink inside a node, each direction")
	fs.IntVar(&f.gpusPerNode, "gpus-per-node", 8, "GPUs per node")
	fs.DurationVar(&f.latency, "latency", 20*time.Microsecond, "time added on a link per sender–receiver stream that uses it")
	fs.BoolVar(&f.colocated, "colocated", false, "rollout GPU i is trainer GPU i (needs as many rollout as trainer GPUs)")
	fs.StringArrayVar(&f.rules, "rule", nil, "`PATTERN=KIND` tried before the default rules (kinds: replicated, column, row, vocab, q, kv, expert-column, expert-row, skip); repeatable")
	fs.BoolVar(&f.json, "json", false, "print one JSON object instead of the table")
	return fs
}

// parseRate reads a link speed: a number and a unit, "400Gb/s" (bits),
// "50GB/s", "450GiB/s" (bytes), and returns bytes per second.
func parseRate(flag, s string) (float64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(s), "/s"), "ps")
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i <= 0 {
		return 0, fmt.Errorf("--%s %s: want a rate such as 400Gb/s or 50GB/s", flag, s)
	}
	v, err := strconv.ParseFloat(t[:i], 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("--%s %s: want a positive rate such as 400Gb/s or 50GB/s", flag, s)
	}
	unit := strings.TrimSpace(t[i:])
	mult := map[byte]float64{'K': 1e3, 'k': 1e3, 'M': 1e6, 'G': 1e9, 'T': 1e12}
	binary := map[byte]float64{'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
	m := 1.0
	if len(unit) >= 2 {
		if strings.HasPrefix(unit[1:], "i") {
			if x, ok := binary[unit[0]]; ok {
				m, unit = x, unit[2:]
			}
		} else if x, ok := mult[unit[0]]; ok {
			m, unit = x, unit[1:]
		}
	}
	switch unit {
	case "B":
		return v * m, nil
	case "b", "bit":
		return v * m / 8, nil
	}
	return 0, fmt.Errorf("--%s %s: the unit must end in b/s (bits) or B/s (bytes)", flag, s)
}

// planReport is demo plan's result, as --json prints it.
type planReport struct {
	Model       string  `json:"model"`
	Parameters  int64   `json:"parameters"`
	Tensors     int     `json:"tensors"`
	DType       string  `json:"dtype"`
	ModelBytes  int64   `json:"model_bytes"`
	Senders     int     `json:"senders"`
	Receivers   int     `json:"receivers"`
	Trainer     string  `json:"trainer"`
	Rollout     string  `json:"rollout"`
	NIC         float64 `json:"nic_bytes_per_second"`
	NVLink      float64 `json:"nvlink_bytes_per_second"`
	GPUsPerNode int     `json:"gpus_per_node"`
	Latency     float64 `json:"latency_seconds"`

	Bytes           int64   `json:"bytes"`
	Moves           int64   `json:"moves"`
	Groups          int     `json:"groups"`
	Streams         int     `json:"streams"`
	SentMax         int64   `json:"bytes_per_sender_max"`
	SentMean        float64 `json:"bytes_per_sender_mean"`
	SentBalance     float64 `json:"sender_balance"`
	ReceivedMax     int64   `json:"bytes_per_receiver_max"`
	ReceivedMean    float64 `json:"bytes_per_receiver_mean"`
	ReceivedBalance float64 `json:"receiver_balance"`
	LinkBytesMax    int64   `json:"bytes_per_link_max"`
	BusiestLink     string  `json:"busiest_link"`

	PredictedSeconds float64 `json:"predicted_seconds"`
	BoundSeconds     float64 `json:"bound_seconds"`
	Bound            string  `json:"bound"`
	OverBound        float64 `json:"predicted_over_bound"`
	BroadcastSeconds float64 `json:"single_sender_broadcast_seconds"`
	PlanSeconds      float64 `json:"plan_seconds"`
	Digest           string  `json:"digest"`
}

// runPlan is `demo plan`: it returns the exit status.
func runPlan(args []string, stdout, stderr io.Writer) int {
	var f planFlags
	fs := planFlagSet(&f)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(stdout, planUsage)
			fmt.Fprint(stdout, fs.FlagUsagesWrapped(80))
			return exitOK
		}
		return failed(stdout, stderr, wantsJSON(args), exitUsage, fmt.Errorf("plan: %v", err))
	}
	if fs.NArg() > 0 {
		return failed(stdout, stderr, f.json, exitUsage, fmt.Errorf("plan: unexpected argument %q", fs.Arg(0)))
	}
	rep, err := makePlan(f)
	if err != nil {
		return failed(stdout, stderr, f.json, exitUsage, fmt.Errorf("plan: %w", err))
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
		return exitOK
	}
	rep.writeTable(stdout)
	return exitOK
}

func makePlan(f planFlags) (*planReport, error) {
	if f.config == "" {
		return nil, errors.New("--config is required: the model's config.json")
	}
	var dt dtype.DType
	switch strings.ToLower(f.dtype) {
	case "bf16":
		dt = dtype.BF16
	case "f16", "fp16":
		dt = dtype.F16
	case "f32", "fp32":
		dt = dtype.F32
	case "fp8", "f8", "f8_e4m3":
		dt = dtype.F8E4M3
	default:
		return nil, fmt.Errorf("--dtype %s: want bf16, f16, f32 or fp8", f.dtype)
	}
	nic, err := parseRate("nic", f.nic)
	if err != nil {
		return nil, err
	}
	nvlink, err := parseRate("nvlink", f.nvlink)
	if err != nil {
		return nil, err
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"trainer-ranks", f.trainerRanks}, {"trainer-tp", f.trainerTP}, {"trainer-ep", f.tEP}, {"replicas", f.replicas}, {"tp", f.tp}, {"ep", f.ep}, {"gpus-per-node", f.gpusPerNode}} {
		if c.v < 1 {
			return nil, fmt.Errorf("--%s %d: must be at least 1", c.name, c.v)
		}
	}
	if f.latency < 0 {
		return nil, fmt.Errorf("--latency %v: must not be negative", f.latency)
	}
	data, err := os.ReadFile(f.config)
	if err != nil {
		return nil, err
	}
	cfg, err := layout.ParseHFConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.config, err)
	}
	rules := layout.DefaultRules()
	var user []layout.Rule
	for _, s := range f.rules {
		r, err := layout.ParseRule(s)
		if err != nil {
			return nil, fmt.Errorf("--rule: %w", err)
		}
		user = append(user, r)
	}
	if rules, err = rules.With(user...); err != nil {
		return nil, fmt.Errorf("--rule: %w", err)
	}
	tspec := layout.Spec{Ranks: f.trainerRanks, TP: f.trainerTP, EP: f.tEP, FSDP: true}
	g := tspec.GroupSize()
	if f.trainerFSDP != 0 && f.trainerFSDP*g != f.trainerRanks {
		return nil, fmt.Errorf("--trainer-fsdp %d × the TP/EP group %d is not --trainer-ranks %d", f.trainerFSDP, g, f.trainerRanks)
	}
	rspec := layout.Spec{TP: f.tp, EP: f.ep}
	rspec.Ranks = f.replicas * rspec.GroupSize()
	if f.colocated && rspec.Ranks != tspec.Ranks {
		return nil, fmt.Errorf("--colocated needs as many rollout GPUs (%d) as trainer GPUs (%d)", rspec.Ranks, tspec.Ranks)
	}
	ts := cfg.Tensors(dt)
	snd, err := layout.NewParallel(ts, rules, cfg.Model(), tspec)
	if err != nil {
		return nil, fmt.Errorf("trainer layout: %w", err)
	}
	rcv, err := layout.NewParallel(ts, rules, cfg.Model(), rspec)
	if err != nil {
		return nil, fmt.Errorf("rollout layout: %w", err)
	}
	links := plan.Links{GPUsPerNode: f.gpusPerNode, NIC: nic, NVLink: nvlink, Latency: f.latency.Seconds(), Colocated: f.colocated}
	start := time.Now()
	p, err := plan.Make(snd, rcv, links)
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	rep := &planReport{
		Model: cfg.ModelType, Tensors: len(ts), DType: dt.String(),
		Senders: tspec.Ranks, Receivers: rspec.Ranks,
		Trainer: fmt.Sprintf("%d GPUs: FSDP %d × TP %d, EP %d", tspec.Ranks, tspec.Ranks/g, max(f.trainerTP, 1), f.tEP),
		Rollout: fmt.Sprintf("%d replicas × %d GPUs (TP %d, EP %d) = %d GPUs", f.replicas, rspec.GroupSize(), f.tp, f.ep, rspec.Ranks),
		NIC:     nic, NVLink: nvlink, GPUsPerNode: f.gpusPerNode, Latency: f.latency.Seconds(),
		Groups: len(p.Groups), PlanSeconds: took.Seconds(), Digest: fmt.Sprintf("%x", p.Digest()),
	}
	for _, t := range ts {
		rep.Parameters += t.Elements()
		rep.ModelBytes += t.Bytes()
	}
	st := p.Stats
	rep.Bytes, rep.Moves, rep.Streams = st.Bytes, st.Moves, st.Streams
	rep.SentMax, rep.SentMean, rep.SentBalance = st.SentMax, st.SentMean, ratio(float64(st.SentMax), st.SentMean)
	rep.ReceivedMax, rep.ReceivedMean, rep.ReceivedBalance = st.ReceivedMax, st.ReceivedMean, ratio(float64(st.ReceivedMax), st.ReceivedMean)
	rep.LinkBytesMax, rep.BusiestLink = st.LinkBytesMax, st.BusiestLink
	rep.PredictedSeconds, rep.BoundSeconds, rep.Bound = st.PredictedSeconds, st.BoundSeconds, st.Bound
	rep.OverBound = ratio(st.PredictedSeconds, st.BoundSeconds)
	rep.BroadcastSeconds = float64(rep.ModelBytes) / nic
	return rep, nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// paramText writes a parameter count as "1.03T" or "671.0B".
func paramText(n int64) string {
	if n >= 1e12 {
		return fmt.Sprintf("%.2fT", float64(n)/1e12)
	}
	return fmt.Sprintf("%.1fB", float64(n)/1e9)
}

func rateText(bytesPerSecond float64) string {
	return fmt.Sprintf("%s/s (%s)", humanize.Bytes(uint64(bytesPerSecond)), strings.Replace(humanize.SIWithDigits(bytesPerSecond*8, 0, "b/s"), " ", "", 1))
}

func (r *planReport) writeTable(w io.Writer) {
	fmt.Fprintf(w, "model:    %s, %s parameters in %d tensors, %s as %s\n", r.Model,
		paramText(r.Parameters), r.Tensors, humanize.Bytes(uint64(r.ModelBytes)), r.DType)
	fmt.Fprintf(w, "trainer:  %s\n", r.Trainer)
	fmt.Fprintf(w, "rollout:  %s\n", r.Rollout)
	fmt.Fprintf(w, "links:    NIC %s per GPU, NVLink %s per GPU, %d GPUs per node, %v per stream\n\n",
		rateText(r.NIC), humanize.Bytes(uint64(r.NVLink))+"/s", r.GPUsPerNode, time.Duration(r.Latency*1e9))
	row := func(k, format string, a ...any) { fmt.Fprintf(w, "  %-24s %s\n", k, fmt.Sprintf(format, a...)) }
	row("bytes moved", "%s over %d streams (%d regions in %d groups)", humanize.Bytes(uint64(r.Bytes)), r.Streams, r.Moves, r.Groups)
	row("per sender", "max %s, mean %s (max/mean %.3f)", humanize.Bytes(uint64(r.SentMax)), humanize.Bytes(uint64(r.SentMean)), r.SentBalance)
	row("per receiver", "max %s, mean %s (max/mean %.3f)", humanize.Bytes(uint64(r.ReceivedMax)), humanize.Bytes(uint64(r.ReceivedMean)), r.ReceivedBalance)
	row("busiest link", "%s, %s", r.BusiestLink, humanize.Bytes(uint64(r.LinkBytesMax)))
	row("predicted", "%.3f s", r.PredictedSeconds)
	row("bound", "%.3f s: %s", r.BoundSeconds, r.Bound)
	row("predicted / bound", "%.3f", r.OverBound)
	row("single-sender broadcast", "%.1f s (the whole model through one NIC)", r.BroadcastSeconds)
	row("planned in", "%.2f s, digest %s", r.PlanSeconds, r.Digest)
}
