package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/stages"
)

// config is everything a demo run needs; every rank of a run gets the same
// one apart from rank.
type config struct {
	ranks     int
	transport string
	size      int64
	tensors   int
	dtypes    []dtype.DType
	bucket    int64
	rounds    int
	verify    bool
	checksum  bool
	json      bool
	trace     string
	timeline  string
	seed      uint64
	timeout   time.Duration
	devices   []int

	// A real checkpoint instead of the synthetic model.
	modelPath string
	out       string
	castTo    dtype.DType // dtype.Invalid: keep

	// Across hosts (or a single rank started by hand).
	rank       int // -1: launch every rank locally
	worldSize  int
	rendezvous string // "etcd://host:port"; empty: embedded
	group      string
	runID      string
	advertise  string
	hostEtcd   string // address rank 0 serves an embedded etcd on (torchrun style)
	localRank  int    // LOCAL_RANK: which of this host's GPUs a rank started across hosts takes; -1 unset

	// Set by the launcher for the rank processes it starts.
	child      bool
	traceEpoch int64
	traceOut   string
}

const usageText = `weightcast demo — stream a model's weights from one rank to many, verified.

Usage:
  demo [flags]                      launch every rank on this machine
  demo --rank R --world-size N --rendezvous etcd://HOST:PORT [flags]
                                    run one rank of a group spread over hosts
  RANK=R WORLD_SIZE=N MASTER_ADDR=H MASTER_PORT=P demo [flags]
                                    the same, torchrun style (rank 0 serves the
                                    rendezvous on MASTER_ADDR:MASTER_PORT)

Flags:
`

// parseConfig reads flags and the torchrun-style environment.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{rank: -1, localRank: -1}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	var size, bucket, dtypes, devices, castTo string
	fs.IntVar(&c.ranks, "ranks", 4, "number of ranks: 1 sender and `N`-1 receivers")
	fs.StringVar(&c.transport, "transport", "auto", "how bucket bytes move: auto, tcp, inproc (one process, goroutines), ipc or nccl")
	fs.StringVar(&size, "size", "1GiB", "total size of the synthetic model")
	fs.IntVar(&c.tensors, "tensors", 291, "number of tensors of the synthetic model (291 is Llama-7B's count)")
	fs.StringVar(&dtypes, "dtypes", "bf16", "comma-separated dtype mix of the synthetic model, e.g. bf16,f32")
	fs.StringVar(&bucket, "bucket", "256MiB", "bucket size; every rank holds two buckets")
	fs.IntVar(&c.rounds, "rounds", 3, "sync rounds (model versions) to send")
	fs.BoolVar(&c.verify, "verify", true, "check every received byte against the source")
	fs.BoolVar(&c.checksum, "checksum", true, "checksum each bucket where its bytes are (on the GPU for device buckets) and check it on every receiver; false saves the last percent of speed")
	fs.BoolVar(&c.json, "json", false, "print one JSON summary on stdout instead of the table")
	fs.StringVar(&c.trace, "trace", "", "write a Chrome trace (open in Perfetto or chrome://tracing) to `FILE`")
	fs.StringVar(&c.timeline, "timeline", "", "draw the pipeline's timeline as an SVG Gantt chart to `FILE`")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the synthetic model's bytes")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "bound on every wait: joining, each bucket, each acknowledgement")
	fs.StringVar(&c.modelPath, "model", "", "sync a safetensors checkpoint (`PATH`: a .safetensors file or a Hugging Face directory of shards) instead of the synthetic model")
	fs.StringVar(&c.out, "out", "", "receivers write what they received as safetensors under `DIR`/rankN, mirroring the source's files")
	fs.StringVar(&castTo, "dtype", "keep", "rollout dtype: keep, bf16 or f16 (floating tensors are cast on the sender, at pack time)")
	fs.StringVar(&devices, "devices", "", "comma-separated GPU indices to use (default: all visible)")
	fs.IntVar(&c.rank, "rank", -1, "run only this rank (with --world-size and --rendezvous, or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)")
	fs.IntVar(&c.worldSize, "world-size", 0, "number of ranks of a group spread over hosts")
	fs.StringVar(&c.rendezvous, "rendezvous", "", "etcd to meet at, `etcd://HOST:PORT` (default: an embedded etcd)")
	fs.StringVar(&c.group, "group", "weightcast-demo", "sync group name; one run at a time may hold a group")
	fs.StringVar(&c.runID, "run-id", "", "id shared by every rank of one launch, new for each launch (default: made up for a local launch; across hosts give it, or TORCHELASTIC_RUN_ID)")
	fs.StringVar(&c.advertise, "advertise", "", "address other hosts reach this one at; sockets then bind every interface")
	fs.BoolVar(&c.child, "child", false, "internal: run as a rank process started by the launcher")
	fs.Int64Var(&c.traceEpoch, "trace-epoch", 0, "internal: trace time origin, Unix nanoseconds")
	fs.StringVar(&c.traceOut, "trace-out", "", "internal: where a rank process writes its trace events")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q; flags start with --", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var err error
	if c.size, err = parseSize("--size", size, 0); err != nil {
		return nil, err
	}
	if c.bucket, err = parseSize("--bucket", bucket, stages.MinBucketSize); err != nil {
		return nil, err
	}
	if c.bucket > 1<<40 {
		return nil, fmt.Errorf("--bucket %s is larger than 1 TiB; use a bucket of a few hundred MiB", bucket)
	}
	for _, s := range strings.Split(dtypes, ",") {
		d, err := dtype.Parse(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--dtypes: %w", err)
		}
		c.dtypes = append(c.dtypes, d)
	}
	switch strings.ToLower(castTo) {
	case "keep", "":
	case "bf16":
		c.castTo = dtype.BF16
	case "f16", "fp16":
		c.castTo = dtype.F16
	default:
		return nil, fmt.Errorf("--dtype %q: choose keep, bf16 or f16", castTo)
	}
	if c.castTo != dtype.Invalid && c.modelPath == "" {
		return nil, errors.New("--dtype casts a checkpoint; give --model PATH (the synthetic model takes --dtypes)")
	}
	if c.modelPath != "" {
		if _, err := os.Stat(c.modelPath); err != nil {
			return nil, fmt.Errorf("--model: %v", err)
		}
	}
	if devices != "" {
		for _, s := range strings.Split(devices, ",") {
			i, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || i < 0 {
				return nil, fmt.Errorf("--devices %q: want comma-separated GPU indices such as 0,1,2", devices)
			}
			c.devices = append(c.devices, i)
		}
	}
	switch {
	case c.tensors < 1:
		return nil, fmt.Errorf("--tensors %d: a model needs at least one tensor", c.tensors)
	case c.rounds < 1:
		return nil, fmt.Errorf("--rounds %d: run at least one round", c.rounds)
	case c.timeout <= 0:
		return nil, fmt.Errorf("--timeout %v: give a positive duration such as 2m", c.timeout)
	}
	switch c.transport {
	case "auto", "tcp", "inproc", "ipc", "nccl":
	default:
		return nil, fmt.Errorf("--transport %q: choose auto, tcp, inproc, ipc or nccl", c.transport)
	}

	// Torchrun-style variables stand in for --rank, --world-size and
	// --rendezvous when those flags are absent.
	if !set["rank"] && getenv("RANK") != "" {
		if c.rank, err = strconv.Atoi(getenv("RANK")); err != nil {
			return nil, fmt.Errorf("RANK=%q is not a number", getenv("RANK"))
		}
	}
	if !set["world-size"] && getenv("WORLD_SIZE") != "" {
		if c.worldSize, err = strconv.Atoi(getenv("WORLD_SIZE")); err != nil {
			return nil, fmt.Errorf("WORLD_SIZE=%q is not a number", getenv("WORLD_SIZE"))
		}
	}
	if !set["rendezvous"] && getenv("MASTER_ADDR") != "" {
		port := getenv("MASTER_PORT")
		if port == "" {
			return nil, errors.New("MASTER_ADDR is set but MASTER_PORT is not; set both, as torchrun does")
		}
		addr := net.JoinHostPort(getenv("MASTER_ADDR"), port)
		c.rendezvous = "etcd://" + addr
		if c.rank == 0 {
			c.hostEtcd = addr
		}
	}
	if c.runID == "" && getenv("TORCHELASTIC_RUN_ID") != "" && getenv("TORCHELASTIC_RUN_ID") != "none" {
		c.runID = getenv("TORCHELASTIC_RUN_ID")
	}
	if v := getenv("LOCAL_RANK"); v != "" {
		if c.localRank, err = strconv.Atoi(v); err != nil || c.localRank < 0 {
			return nil, fmt.Errorf("LOCAL_RANK=%q is not a rank", v)
		}
	}

	if c.rank >= 0 {
		c.ranks = c.worldSize
	}
	if c.rank >= 0 && !c.child {
		if c.worldSize < 2 {
			return nil, fmt.Errorf("--rank %d needs --world-size of 2 or more (or WORLD_SIZE)", c.rank)
		}
		if c.rank >= c.worldSize {
			return nil, fmt.Errorf("--rank %d outside a world of %d ranks (0..%d)", c.rank, c.worldSize, c.worldSize-1)
		}
		if c.rendezvous == "" {
			return nil, errors.New("--rank needs --rendezvous etcd://HOST:PORT (or MASTER_ADDR and MASTER_PORT) so the ranks can meet")
		}
		if c.transport == "inproc" {
			return nil, errors.New("--transport inproc runs every rank in one process; it cannot be used with --rank")
		}
		if c.runID == "" {
			return nil, errors.New("--rank needs --run-id: the same on every rank of a launch and new for every launch (a job id, or $(date +%s) shared by the launcher), so that a crashed launch never blocks the next")
		}
		c.ranks = c.worldSize
	}
	if c.ranks < 2 {
		return nil, fmt.Errorf("--ranks %d: a sync needs a sender and at least one receiver (2 or more)", c.ranks)
	}
	if c.rendezvous != "" {
		if _, err := etcdEndpoint(c.rendezvous); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func parseSize(flagName, s string, minimum int64) (int64, error) {
	v, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a size such as 256MiB or 1GiB", flagName, s)
	}
	if int64(v) < minimum || v > 1<<50 {
		return 0, fmt.Errorf("%s %s: must be at least %s", flagName, s, humanize.IBytes(uint64(minimum)))
	}
	return int64(v), nil
}

// etcdEndpoint turns etcd://host:port into host:port.
func etcdEndpoint(u string) (string, error) {
	hp, ok := strings.CutPrefix(u, "etcd://")
	if !ok || hp == "" {
		return "", fmt.Errorf("--rendezvous %q: want etcd://HOST:PORT", u)
	}
	if _, _, err := net.SplitHostPort(hp); err != nil {
		return "", fmt.Errorf("--rendezvous %q: want etcd://HOST:PORT: %v", u, err)
	}
	return hp, nil
}

// childArgs are the flags a launched rank process gets: the run's settings
// plus its place in the run.
func (c *config) childArgs(rank int, endpoint, traceOut string) []string {
	dts := make([]string, len(c.dtypes))
	for i, d := range c.dtypes {
		dts[i] = d.String()
	}
	args := []string{
		"--child",
		"--rank", strconv.Itoa(rank),
		"--world-size", strconv.Itoa(c.ranks),
		"--rendezvous", "etcd://" + endpoint,
		"--group", c.group,
		"--run-id", c.runID,
		"--transport", c.transport,
		"--size", strconv.FormatInt(c.size, 10),
		"--tensors", strconv.Itoa(c.tensors),
		"--dtypes", strings.Join(dts, ","),
		"--bucket", strconv.FormatInt(c.bucket, 10),
		"--rounds", strconv.Itoa(c.rounds),
		"--verify=" + strconv.FormatBool(c.verify),
		"--checksum=" + strconv.FormatBool(c.checksum),
		"--seed", strconv.FormatUint(c.seed, 10),
		"--timeout", c.timeout.String(),
		"--trace-epoch", strconv.FormatInt(c.traceEpoch, 10),
	}
	if traceOut != "" {
		args = append(args, "--trace-out", traceOut)
	}
	if c.modelPath != "" {
		args = append(args, "--model", c.modelPath)
	}
	if c.out != "" {
		args = append(args, "--out", c.out)
	}
	if c.castTo != dtype.Invalid {
		args = append(args, "--dtype", strings.ToLower(c.castTo.String()))
	}
	if len(c.devices) > 0 {
		ds := make([]string, len(c.devices))
		for i, d := range c.devices {
			ds[i] = strconv.Itoa(d)
		}
		args = append(args, "--devices", strings.Join(ds, ","))
	}
	return args
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
