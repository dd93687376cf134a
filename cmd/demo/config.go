package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/pflag"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
)

// config is everything a demo run needs; every rank of a run gets the same
// one apart from rank.
type config struct {
	ranks     int
	senders   int // routed: ranks [0, senders) send (0: one sender broadcasting)
	tp        int // routed: the receivers' tensor-parallel size
	transport string
	size      int64
	tensors   int
	dtypes    []dtype.DType
	bucket    int64
	rounds    int
	verify    bool
	checksum  bool
	direct    bool
	turns     bool
	bucketMAC string
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
	quantize  stages.QuantizeConfig

	// Across hosts (or a single rank started by hand).
	rank       int // -1: launch every rank locally
	worldSize  int
	rendezvous string // "etcd://host:port"; empty: embedded
	group      string
	runID      string
	advertise  string
	hostEtcd   string // address rank 0 serves an embedded etcd on (torchrun style)
	served     bool   // the rendezvous is rank 0's own (torchrun style): no run id needed
	localWorld int    // LOCAL_WORLD_SIZE: ranks on this host (torchrun), 0 when unknown
	localRank  int    // LOCAL_RANK: which of this host's GPUs a rank started across hosts takes; -1 unset

	// Security: the group secret and the TLS settings, read by parseConfig.
	secretFile string
	secret     *auth.Secret // nil: no secret
	tlsFiles   auth.TLSFiles
	tls        *auth.TLS // nil: plain connections

	// opts are the library settings every rank of the run shares, from
	// the flags above, checked by weightcast.Options.Validate; each rank
	// adds its place (rank, world size, rendezvous, device).
	opts weightcast.Options

	// Set by the launcher for the rank processes it starts.
	child      bool
	traceEpoch int64
	traceOut   string
}

// usageHead and usageTail frame the flags in --help.
const (
	usageHead = `weightcast demo: stream a model's weights from one rank to many, verified.

Usage:
  demo [flags]                      launch every rank on this machine
  demo --rank R --world-size N --rendezvous etcd://HOST:PORT [flags]
                                    run one rank of a group spread over hosts
  RANK=R WORLD_SIZE=N MASTER_ADDR=H MASTER_PORT=P demo [flags]
                                    the same, torchrun style (rank 0 serves the
                                    rendezvous on MASTER_ADDR:MASTER_PORT)
  demo plan --config config.json [flags]
                                    plan sharded trainer → sharded rollout
                                    transfers on paper (demo plan --help)

Flags:
`
	usageTail = `
Exit status: 0 synced (and verified); 1 the run failed (the summary says which
rank and why); 2 a flag or input the demo cannot use, found before any rank
starts; 130 or 143 stopped by SIGINT or SIGTERM (the summary says what each
rank committed).
`
)

// Limits the demo checks before it starts anything.
const (
	// maxLocalRanks caps a local launch, which starts one process per
	// rank on this machine.
	maxLocalRanks = 64
	// maxSize caps the synthetic model.
	maxSize = 1 << 50
	// defaultBucket is the demo's bucket size, smaller than the library's
	// (weightcast.DefaultBucketSize): a local launch holds two buckets for
	// each of its ranks on one machine.
	defaultBucket = "256MiB"
)

// flagOf names the fields of weightcast.Options (their JSON keys, as a
// *weightcast.FieldError names them) by the demo's flags.
var flagOf = map[string]string{
	"group": "group", "rank": "rank", "world_size": "world-size", "rendezvous": "rendezvous",
	"run_id": "run-id", "transport": "transport", "bucket": "bucket", "timeout": "timeout",
	"checksum": "checksum", "direct": "direct", "turns": "turns", "dtype": "dtype", "quantize": "quantize",
	"advertise": "advertise", "secret_file": "secret-file", "bucket_mac": "bucket-mac", "device": "devices", "senders": "senders", "tp": "tp",
}

// optionError says a library configuration error in the demo's words: a
// *weightcast.FieldError names its flag (--bucket, not bucket) and, where
// typed has it, the value as it was typed ("--bucket 100KB", not 100000).
func optionError(err error, typed map[string]string) error {
	var fe *weightcast.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	name, ok := flagOf[fe.Field]
	if !ok {
		name = fe.Field
	}
	if v, ok := typed[fe.Field]; ok && fe.Value != "" {
		at := *fe
		at.Value, fe = v, &at
	}
	return fe.Spelled("--"+name, " ")
}

// flagSet defines every flag on c and returns the set and where the flags
// that need parsing after it land.
func flagSet(c *config) (*pflag.FlagSet, *rawFlags) {
	raw := &rawFlags{}
	fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned and printed once, by run
	fs.Usage = func() {}
	fs.SortFlags = false
	fs.IntVar(&c.ranks, "ranks", 4, fmt.Sprintf("number of ranks: 1 sender and `N`-1 receivers, one process each (2 to %d)", maxLocalRanks))
	fs.StringVar(&c.transport, "transport", "auto", "`NAME` of how bucket bytes move: auto, tcp, inproc (one process, goroutines), ipc or nccl")
	fs.StringVar(&raw.size, "size", "1GiB", "total `SIZE` of the synthetic model (up to 1 PiB)")
	fs.IntVar(&c.senders, "senders", 0, "route from `S` senders (ranks 0..S-1, each holding a dim-0 shard of the model, as FSDP) to the other ranks, on a plan; 0 broadcasts from rank 0")
	fs.IntVar(&c.tp, "tp", 1, "receivers form replicas of `T` tensor-parallel ranks, each taking only its shard (routed; --senders 1 when not given)")
	fs.IntVar(&c.tensors, "tensors", 291, "number of tensors `N` of the synthetic model (291 is Llama-7B's count)")
	fs.StringVar(&raw.dtypes, "dtypes", "bf16", "comma-separated dtype `LIST` of the synthetic model, e.g. bf16,f32")
	fs.StringVar(&raw.bucket, "bucket", defaultBucket, "bucket `SIZE`, 1 KiB to 1 TiB; every rank holds two buckets")
	fs.IntVar(&c.rounds, "rounds", 3, "sync rounds `N` (model versions) to send")
	fs.BoolVar(&c.verify, "verify", true, "check every received byte against the source")
	fs.BoolVar(&c.checksum, "checksum", true, "checksum each bucket where its bytes are (on the GPU for device buckets) and check it on every receiver; false saves the last percent of speed")
	fs.BoolVar(&c.turns, "turns", true, "with direct buckets on a GPU not shared through MPS, have the receivers copy in turns of at least 4 GiB, one after another, instead of all at once; false copies all at once, to compare")
	fs.BoolVar(&c.direct, "direct", true, "let receivers on the sender's GPU copy its device tensors straight out of its memory (ipc) instead of taking buckets (with --secret-file, each bucket's MAC computed where they lie); false packs every bucket, to compare")
	fs.BoolVar(&c.json, "json", false, "print one JSON summary on stdout instead of the table (also when the run fails)")
	fs.StringVar(&c.trace, "trace", "", "write a Chrome trace (open in Perfetto or chrome://tracing) to `FILE`")
	fs.StringVar(&c.timeline, "timeline", "", "draw the pipeline's timeline as an SVG Gantt chart to `FILE`")
	fs.Uint64Var(&c.seed, "seed", 1, "`SEED` of the synthetic model's bytes")
	fs.DurationVar(&c.timeout, "timeout", weightcast.DefaultTimeout, "`DURATION` bounding every wait: joining, each bucket, each acknowledgement")
	fs.StringVar(&c.modelPath, "model", "", "sync a safetensors checkpoint (`PATH`: a .safetensors file or a Hugging Face directory of shards) instead of the synthetic model")
	fs.StringVar(&c.out, "out", "", "receivers write what they received as safetensors under `DIR`/rankN, mirroring the source's files (and its config.json, with transformers' FP8 quantization_config under --quantize fp8-block)")
	fs.StringVar(&raw.castTo, "dtype", "keep", "rollout `DTYPE` of a --model checkpoint: keep, bf16 or f16 (floating tensors are cast on the sender, at pack time)")
	fs.StringVar(&raw.quantize, "quantize", "none", "rollout quantization `SCHEME` on the sender: none, or fp8-block (2-D linear weights as F8_E4M3 with F32 _scale_inv per 128x128 block, quantized on the sender's CPU, or on its GPU for a model held there)")
	fs.StringVar(&raw.quantInclude, "quantize-include", "", "with --quantize, also quantize tensors whose names match this Go `REGEXP`")
	fs.StringVar(&raw.quantExclude, "quantize-exclude", "", "with --quantize, leave tensors whose names match this Go `REGEXP` as they are (wins over --quantize-include)")
	fs.StringVar(&raw.devices, "devices", "", "comma-separated GPU indices to use (`LIST`; default: all visible)")
	fs.IntVar(&c.rank, "rank", -1, "run only rank `R` (with --world-size and --rendezvous, or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)")
	fs.IntVar(&c.worldSize, "world-size", 0, "number of ranks `N` of a group spread over hosts")
	fs.StringVar(&c.rendezvous, "rendezvous", "", "etcd to meet at, `etcd://HOST:PORT` (default: an embedded etcd)")
	fs.StringVar(&c.group, "group", "weightcast-demo", "sync group `NAME` (no '/' or spaces); one run at a time may hold a group")
	fs.StringVar(&c.runID, "run-id", "", "`ID` shared by every rank of one launch, new for each launch (default: TORCHELASTIC_RUN_ID; made up for a local launch, and by rank 0 when it serves the rendezvous (MASTER_ADDR); with --rendezvous give it)")
	fs.StringVar(&c.advertise, "advertise", "", "`ADDRESS` other hosts reach this one at; sockets then bind every interface")
	fs.StringVar(&c.secretFile, "secret-file", "", "read the group secret from `PATH` (mode 0600; or "+auth.SecretFileEnv+"): every rank must prove it, every record and message is signed, every bucket carries a MAC")
	fs.StringVar(&c.bucketMAC, "bucket-mac", "blake3", "with --secret-file, the `MAC` the sender puts on every bucket: blake3 (keyed BLAKE3) or poly1305-aes (Poly1305-AES, less work per byte on a GPU)")
	fs.StringVar(&c.tlsFiles.CA, "tls-ca", "", "with --tls-cert and --tls-key: mutual TLS 1.3 for etcd, the tcp chain and the metadata bus, trusting the CA certificates in `FILE`")
	fs.StringVar(&c.tlsFiles.Cert, "tls-cert", "", "this host's certificate `FILE`, valid for the address other ranks dial it by")
	fs.StringVar(&c.tlsFiles.Key, "tls-key", "", "the private key `FILE` of --tls-cert")
	// Set by the launcher for the rank processes it starts.
	fs.BoolVar(&c.child, "child", false, "internal: run as a rank process started by the launcher")
	fs.Int64Var(&c.traceEpoch, "trace-epoch", 0, "internal: trace time origin, Unix nanoseconds")
	fs.StringVar(&c.traceOut, "trace-out", "", "internal: where a rank process writes its trace events")
	for _, name := range []string{"child", "trace-epoch", "trace-out"} {
		fs.MarkHidden(name)
	}
	return fs, raw
}

// rawFlags are the flags parsed into config after the flag set has run.
type rawFlags struct {
	size, bucket, dtypes, devices, castTo string
	quantize, quantInclude, quantExclude  string
}

// writeHelp prints --help: what the demo does, every flag with its default
// in --flag form, and the exit statuses.
func writeHelp(w io.Writer) {
	fs, _ := flagSet(&config{})
	fmt.Fprint(w, usageHead)
	fmt.Fprint(w, fs.FlagUsagesWrapped(80))
	fmt.Fprint(w, usageTail)
}

// wantsJSON reports whether args ask for --json, read without parsing them
// so that an error in another flag is still printed as JSON.
func wantsJSON(args []string) bool {
	want := false
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "--json" {
			want = true
		} else if v, ok := strings.CutPrefix(a, "--json="); ok {
			want, _ = strconv.ParseBool(v)
		}
	}
	return want
}

// flagError rewrites pflag's errors in the demo's words: which flag, what
// was given, what it takes.
func flagError(err error) error {
	var invalid *pflag.InvalidValueError
	var unknown *pflag.NotExistError
	var missing *pflag.ValueRequiredError
	switch {
	case errors.As(err, &invalid):
		f := invalid.GetFlag()
		return fmt.Errorf("--%s %q: want %s", f.Name, invalid.GetValue(), valueKind(f.Value.Type()))
	case errors.As(err, &missing):
		return fmt.Errorf("--%s needs a value; see --help", missing.GetFlag().Name)
	case errors.As(err, &unknown):
		if group := unknown.GetSpecifiedShortnames(); len(group) > 1 {
			// pflag read -ranks as the one-letter flags r, a, n, k, s.
			name, _, _ := strings.Cut(group, "=")
			return fmt.Errorf("unknown flag -%s: flags take two dashes (--%s); see --help", group, name)
		} else if group != "" {
			return fmt.Errorf("unknown flag -%s; see --help", group)
		}
		return fmt.Errorf("unknown flag --%s; see --help", unknown.GetSpecifiedName())
	}
	return fmt.Errorf("%v; see --help", err)
}

// valueKind says in words what a flag of a pflag value type takes.
func valueKind(typ string) string {
	switch typ {
	case "int", "int64", "uint64":
		return "a whole number"
	case "bool":
		return "true or false"
	case "duration":
		return "a duration such as 90s or 2m"
	}
	return "a " + typ
}

// parseConfig reads flags and the torchrun-style environment. It returns
// pflag.ErrHelp for --help.
func parseConfig(args []string, getenv func(string) string) (*config, error) {
	c := &config{rank: -1, localRank: -1}
	fs, raw := flagSet(c)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, err
		}
		return nil, flagError(err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q; flags start with --; see --help", fs.Arg(0))
	}

	var err error
	if c.size, err = parseSize("--size", raw.size, 0, maxSize); err != nil {
		return nil, err
	}
	// The library checks the bucket's range (Options.Validate, below);
	// on the command line 0 is a size given, not "the default".
	if c.bucket, err = parseSize("--bucket", raw.bucket, 0, 1<<62); err != nil {
		return nil, err
	}
	if c.bucket == 0 {
		return nil, fmt.Errorf("--bucket %s: give a size of 1 KiB or more", raw.bucket)
	}
	for _, s := range strings.Split(raw.dtypes, ",") {
		d, err := dtype.Parse(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--dtypes: %v", err)
		}
		c.dtypes = append(c.dtypes, d)
	}
	switch strings.ToLower(raw.castTo) {
	case "keep", "":
	case "bf16":
		c.castTo = dtype.BF16
	case "f16", "fp16":
		c.castTo = dtype.F16
	default:
		return nil, fmt.Errorf("--dtype %q: choose keep, bf16 or f16", raw.castTo)
	}
	sc, err := quant.ParseScheme(raw.quantize)
	if err != nil {
		return nil, fmt.Errorf("--quantize: %v", err)
	}
	c.quantize.Scheme = sc
	if raw.quantInclude != "" {
		c.quantize.Include = []string{raw.quantInclude}
	}
	if raw.quantExclude != "" {
		c.quantize.Exclude = []string{raw.quantExclude}
	}
	if c.castTo != dtype.Invalid && c.modelPath == "" {
		return nil, fmt.Errorf("--dtype casts a checkpoint; give --model PATH (the synthetic model takes --dtypes)")
	}
	if raw.devices != "" {
		for _, s := range strings.Split(raw.devices, ",") {
			i, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || i < 0 {
				return nil, fmt.Errorf("--devices %q: want comma-separated GPU indices such as 0,1,2", raw.devices)
			}
			c.devices = append(c.devices, i)
		}
	}
	switch {
	case c.tensors < 1:
		return nil, fmt.Errorf("--tensors %d: a model needs at least one tensor", c.tensors)
	case c.modelPath == "":
		if err := c.checkSyntheticSize(raw.size); err != nil {
			return nil, err
		}
	}
	switch {
	case c.rounds < 1:
		return nil, fmt.Errorf("--rounds %d: run at least one round", c.rounds)
	case c.timeout == 0: // on the command line a duration given, not "the default"
		return nil, fmt.Errorf("--timeout %v: give a positive duration such as 2m", c.timeout)
	}

	// Torchrun-style variables stand in for --rank, --world-size and
	// --rendezvous when those flags are absent.
	if !fs.Changed("rank") && getenv("RANK") != "" {
		if c.rank, err = strconv.Atoi(getenv("RANK")); err != nil {
			return nil, fmt.Errorf("RANK=%q is not a number", getenv("RANK"))
		}
	}
	if !fs.Changed("world-size") && getenv("WORLD_SIZE") != "" {
		if c.worldSize, err = strconv.Atoi(getenv("WORLD_SIZE")); err != nil {
			return nil, fmt.Errorf("WORLD_SIZE=%q is not a number", getenv("WORLD_SIZE"))
		}
	}
	if !fs.Changed("rendezvous") && getenv("MASTER_ADDR") != "" {
		port := getenv("MASTER_PORT")
		if port == "" {
			return nil, fmt.Errorf("MASTER_ADDR is set but MASTER_PORT is not; set both, as torchrun does")
		}
		addr := net.JoinHostPort(getenv("MASTER_ADDR"), port)
		c.rendezvous, c.served = "etcd://"+addr, true
		if c.rank == 0 {
			c.hostEtcd = addr
		}
	}
	if c.runID == "" && getenv("TORCHELASTIC_RUN_ID") != "" && getenv("TORCHELASTIC_RUN_ID") != "none" {
		c.runID = getenv("TORCHELASTIC_RUN_ID")
	}
	if v := getenv("LOCAL_WORLD_SIZE"); v != "" {
		if c.localWorld, err = strconv.Atoi(v); err != nil || c.localWorld < 1 {
			return nil, fmt.Errorf("LOCAL_WORLD_SIZE=%q is not a number of ranks", v)
		}
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
			return nil, fmt.Errorf("--rank needs --rendezvous etcd://HOST:PORT (or MASTER_ADDR and MASTER_PORT) so the ranks can meet")
		}
		if inProcess(c.transport) {
			return nil, fmt.Errorf("--transport inproc runs every rank in one process; it cannot be used with --rank")
		}
		if c.runID == "" && !c.served {
			return nil, fmt.Errorf("--rank needs --run-id: the same on every rank of a launch and new for every launch (a job id, or $(date +%%s) shared by the launcher), so that a crashed launch never blocks the next; with MASTER_ADDR and MASTER_PORT, where rank 0 serves the rendezvous, it needs none")
		}
	}
	if c.ranks < 2 {
		return nil, fmt.Errorf("--ranks %d: a sync needs a sender and at least one receiver (2 or more)", c.ranks)
	}
	if err := c.checkRouted(); err != nil {
		return nil, err
	}
	if c.rank < 0 && c.ranks > maxLocalRanks {
		where := "starts one process per rank on this machine"
		if inProcess(c.transport) {
			where = "with --transport inproc runs every rank in this process"
		}
		return nil, fmt.Errorf("--ranks %d: a local launch %s, at most %d; for more, run ranks on several hosts (--rank, --world-size)", c.ranks, where, maxLocalRanks)
	}
	if c.rendezvous != "" {
		if _, err := etcdEndpoint(c.rendezvous); err != nil {
			return nil, err
		}
	}
	if c.secretFile == "" {
		c.secretFile = getenv(auth.SecretFileEnv)
	}
	// The one validation of the library's settings (and the defaults it
	// fills), in the demo's words: the group and run id names, the
	// transport, the bucket's range, the timeout, the quantization and the
	// group secret, which it reads.
	c.opts = weightcast.Options{
		Group: c.group, RunID: c.runID, Transport: c.transport,
		BucketSize: c.bucket, Timeout: c.timeout, NoChecksum: !c.checksum, NoDirect: !c.direct, NoTurns: !c.turns,
		Quantize: c.quantize, Advertise: c.advertise, SecretFile: c.secretFile, TLS: c.tlsFiles, Senders: c.senders,
		BucketMAC: mac.Kind(c.bucketMAC),
	}
	if err := c.opts.Validate(); err != nil {
		return nil, optionError(err, map[string]string{"bucket": raw.bucket})
	}
	c.secret = c.opts.Secret
	if !c.tlsFiles.IsZero() {
		if c.tls, err = c.tlsFiles.Load(); err != nil {
			return nil, fmt.Errorf("--tls-ca, --tls-cert, --tls-key: %w", err)
		}
	}
	return c, nil
}

// parseSize reads a size flag such as 256MiB and checks it is in
// [minimum, maximum].
func parseSize(flagName, s string, minimum, maximum int64) (int64, error) {
	v, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a size such as 256MiB or 1GiB", flagName, s)
	}
	switch {
	case v > uint64(maximum):
		return 0, fmt.Errorf("%s %s is over the limit of %s", flagName, s, humanize.IBytes(uint64(maximum)))
	case v < uint64(minimum):
		return 0, fmt.Errorf("%s %s is below the minimum of %s", flagName, s, humanize.IBytes(uint64(minimum)))
	}
	return int64(v), nil
}

// etcdEndpoint turns etcd://host:port into host:port.
func etcdEndpoint(u string) (string, error) {
	hp, err := weightcast.RendezvousAddr(u)
	if err != nil {
		return "", optionError(err, nil) // --rendezvous "...": want ...
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
		"--direct=" + strconv.FormatBool(c.direct),
		"--turns=" + strconv.FormatBool(c.turns),
		"--bucket-mac", c.bucketMAC,
		"--seed", strconv.FormatUint(c.seed, 10),
		"--timeout", c.timeout.String(),
		"--trace-epoch", strconv.FormatInt(c.traceEpoch, 10),
	}
	if traceOut != "" {
		args = append(args, "--trace-out", traceOut)
	}
	if c.secretFile != "" {
		args = append(args, "--secret-file", c.secretFile)
	}
	if !c.tlsFiles.IsZero() {
		args = append(args, "--tls-ca", c.tlsFiles.CA, "--tls-cert", c.tlsFiles.Cert, "--tls-key", c.tlsFiles.Key)
	}
	if c.modelPath != "" {
		args = append(args, "--model", c.modelPath)
	}
	if c.senders > 0 {
		args = append(args, "--senders", strconv.Itoa(c.senders), "--tp", strconv.Itoa(c.tp))
	}
	if c.out != "" {
		args = append(args, "--out", c.out)
	}
	if c.castTo != dtype.Invalid {
		args = append(args, "--dtype", strings.ToLower(c.castTo.String()))
	}
	if c.quantize.Scheme != quant.None {
		args = append(args, "--quantize", string(c.quantize.Scheme))
		if len(c.quantize.Include) > 0 {
			args = append(args, "--quantize-include", c.quantize.Include[0])
		}
		if len(c.quantize.Exclude) > 0 {
			args = append(args, "--quantize-exclude", c.quantize.Exclude[0])
		}
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

// preflight checks, before any rank starts, what can be checked on this
// machine: that the checkpoint opens and its headers are within limits,
// that --out, --trace and --timeline can be written, and that a rank's two
// host buckets fit in this machine's memory. transportName is the resolved
// transport.
func (c *config) preflight(transportName string) error {
	if c.modelPath != "" {
		if _, err := c.model(0); err != nil {
			return fmt.Errorf("--model %s: %w", c.modelPath, err)
		}
	}
	if c.out != "" {
		if err := checkWritable("--out", c.out, true); err != nil {
			return err
		}
	}
	for _, f := range []struct{ flag, path string }{{"--trace", c.trace}, {"--timeline", c.timeline}} {
		if f.path != "" {
			if err := checkWritable(f.flag, f.path, false); err != nil {
				return err
			}
		}
	}
	if d, _ := transport.Lookup(transportName); !d.DeviceMemory {
		avail := memAvailable()
		if avail <= 0 {
			avail = memTotal()
		}
		return c.checkHostBuckets(avail)
	}
	return nil
}

// checkSyntheticSize refuses a --size (raw, as given) smaller than the
// smallest synthetic model of --tensors tensors of the --dtypes mix: the
// model cannot be made that small, and would silently be larger.
func (c *config) checkSyntheticSize(raw string) error {
	if c.size == 0 {
		return fmt.Errorf("--size %s: a model needs at least one byte; give a size such as 1GiB", raw)
	}
	least, err := source.Synthetic{Size: 0, Tensors: c.tensors, DTypes: c.dtypes}.Model()
	if err != nil {
		return fmt.Errorf("--size, --tensors, --dtypes: %v", err)
	}
	if c.size < least.Size() {
		return fmt.Errorf("--size %s: the smallest synthetic model of %d tensors of %s is %s (%d bytes); give --size %d or more, or fewer --tensors",
			raw, c.tensors, dtypeList(c), sizeText(least.Size()), least.Size(), least.Size())
	}
	return nil
}

// checkHostBuckets checks that the host buckets of every rank on this
// machine fit in avail bytes of memory (0: unknown, not checked): two per
// rank, and a local launch (or inproc) runs all its ranks here; a rank of
// its own counts LOCAL_WORLD_SIZE ranks on its host when torchrun says so.
func (c *config) checkHostBuckets(avail int64) error {
	local := c.ranks
	if c.rank >= 0 {
		local = max(1, c.localWorld)
	}
	need := int64(local) * 2 * c.bucket
	if avail <= 0 || need <= avail {
		return nil
	}
	who := fmt.Sprintf("the %d ranks on this machine hold two buckets each", local)
	if local == 1 {
		who = "this rank holds two buckets"
	}
	fix := "a smaller --bucket or fewer --ranks"
	if c.rank >= 0 {
		fix = "a smaller --bucket, or fewer ranks on this host"
	}
	return fmt.Errorf("--bucket %s: %s in host memory (%s in all), more than the %s this machine has available; use %s",
		sizeText(c.bucket), who, sizeText(need), sizeText(avail), fix)
}

// checkWritable checks, without leaving anything behind, that path (a file,
// or with dir a directory) can be written for flag: that a file can be
// created where it goes, in path itself or in the nearest directory above
// it that exists.
func checkWritable(flag, path string, dir bool) error {
	st, err := os.Stat(path)
	switch {
	case err == nil && st.IsDir() && !dir:
		return fmt.Errorf("%s %s is a directory; give a file name", flag, path)
	case err == nil && !st.IsDir() && dir:
		return fmt.Errorf("%s %s is a file; give a directory", flag, path)
	}
	at := path
	if !dir || err != nil {
		at = filepath.Dir(path)
	}
	for {
		st, err := os.Stat(at)
		if err == nil && !st.IsDir() {
			return fmt.Errorf("%s %s: %s is not a directory", flag, path, at)
		}
		if err == nil || !errors.Is(err, os.ErrNotExist) || at == filepath.Dir(at) {
			break
		}
		at = filepath.Dir(at)
	}
	f, err := os.CreateTemp(at, ".weightcast-check-*")
	if err != nil {
		return fmt.Errorf("%s %s: cannot write in %s: %w", flag, path, at, pathReason(err))
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// pathReason is a file system error without the path it names, for
// messages that name the path themselves.
func pathReason(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// memTotal is this machine's memory in bytes (Linux MemTotal), or 0 where
// it cannot be read.
func memTotal() int64 { return procKiB("/proc/meminfo", "MemTotal:") }

// memAvailable is the memory the kernel estimates is available for new
// allocations without swapping (MemAvailable), 0 where unknown.
func memAvailable() int64 { return procKiB("/proc/meminfo", "MemAvailable:") }

// procKiB reads a "Key: N kB" line of a /proc file as bytes, or 0.
func procKiB(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			if f := strings.Fields(v); len(f) >= 1 {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}
