package weightcast

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// Defaults of Options' zero values.
const (
	DefaultGroup      = "weightcast"
	DefaultBucketSize = 1 << 30
	DefaultTimeout    = 2 * time.Minute
)

// ErrConfig is wrapped by every error about Options or arguments that
// cannot work (a rank outside the world, an unknown transport, a tensor
// that cannot be sent as given): the caller must change something.
var ErrConfig = errors.New("invalid configuration")

// Options place one process in a sync group. One struct carries every
// setting, so that new ones (a group secret, TLS) are new fields. It is
// also the configuration of every front end: the C library (and through it
// Python) decodes its JSON object into Options (UnmarshalJSON: the keys are
// the json tags below, and those the translator in options_json.go
// names), and the demo fills it from its flags. Validate, the one
// validation pass, fills the defaults (DefaultGroup, DefaultBucketSize,
// DefaultTimeout) and reports a setting that cannot work as a *FieldError
// naming its JSON key.
type Options struct {
	// Group names the sync group; one run at a time may hold it.
	// Empty means DefaultGroup.
	Group string `json:"group,omitempty"`
	// Rank is this process's place: 0 sends, 1..WorldSize-1 receive.
	// From JSON: null or left out means -1, from RANK (FromEnv).
	Rank int `json:"rank"`
	// WorldSize counts the sender and every receiver (at least 2).
	WorldSize int `json:"world_size,omitempty"`
	// Rendezvous is where the ranks meet: "etcd://HOST:PORT". Empty only
	// with Transport "inproc", whose ranks are goroutines of one process.
	Rendezvous string `json:"rendezvous,omitempty"`
	// ServeRendezvous makes rank 0 serve an embedded etcd at Rendezvous's
	// address (torchrun's MASTER_ADDR:MASTER_PORT); the others dial it.
	ServeRendezvous bool `json:"serve_rendezvous,omitempty"`
	// RunID names this launch: the same on every rank, new for every
	// launch, so that a crashed launch never blocks the next. With
	// ServeRendezvous it may be left empty: the rendezvous rank 0 serves
	// lives as long as the run, so rank 0 makes up a run id and publishes
	// it there, and the other ranks read it from the server they dial.
	RunID string `json:"run_id,omitempty"`
	// Transport moves the bucket bytes: "auto" (or empty), or the name of
	// a registered transport (transport.Names: the built-ins are "tcp",
	// "ipc", "nccl" and "inproc"). auto is decided from what every rank
	// reported when it joined, the same on all (transport.Choose): the
	// first registered transport, by preference, that can connect every
	// pair of ranks — nccl with a GPU per rank, ipc when the ranks share
	// one host's GPUs, tcp when some rank has no GPU.
	Transport string `json:"transport,omitempty"`
	// Senders, when above 0, makes the group a routed one (package
	// route): ranks [0, Senders) send, each the shards of the model it
	// holds (Sender.SendShards), and the other ranks receive only what
	// they need (TP), on a plan made once per layout. 0 (the default) is
	// one sender, rank 0, broadcasting whole tensors to every receiver.
	// Every rank is given the same.
	Senders int `json:"senders,omitempty"`
	// TP and TPRank, on a receiver of a routed group, make it take its
	// tensor-parallel shard: rank TPRank of TP, sliced as vLLM's loaders
	// slice Llama, Qwen and DeepSeek-style names (layout.DefaultRules).
	// TP 0 or 1 takes every tensor whole. Heads and KVHeads give the
	// attention head counts that key/value projections are split by (when
	// TP exceeds KVHeads they are replicated, as vLLM does).
	TP      int `json:"tp,omitempty"`
	TPRank  int `json:"tp_rank,omitempty"`
	Heads   int `json:"heads,omitempty"`
	KVHeads int `json:"kv_heads,omitempty"`
	// TPRules, "PATTERN=KIND" each (layout.ParseRule), are tried before
	// the default rules: for names they do not know or split otherwise.
	TPRules []string `json:"tp_rules,omitempty"`
	// BucketSize is the size of each of the two bucket buffers of every
	// rank, the same on all. 0 means DefaultBucketSize. In JSON a number
	// of bytes or a size such as "256MiB".
	BucketSize int64 `json:"bucket,omitempty"`
	// Timeout bounds every wait: joining, each bucket, each
	// acknowledgement. 0 means DefaultTimeout. In JSON seconds, a number.
	Timeout time.Duration `json:"timeout,omitempty"`
	// NoChecksum turns off the per-bucket checksum the sender computes
	// and every receiver checks. In JSON "checksum": false (the zero value
	// of both is the checksum on).
	NoChecksum bool `json:"-"`
	// RolloutDType, when valid, is the dtype the sender casts every
	// floating-point tensor (F32, BF16, F16) to before it is sent, on the
	// GPU for device tensors (stages.Cast): BF16 or F16 for a bf16 rollout
	// of an f32 trainer, as verl's rollout_dtype. dtype.Invalid (the zero
	// value) sends every tensor as it is. In JSON "dtype": "bf16", "f16",
	// "f32", or "keep".
	RolloutDType dtype.DType `json:"-"`
	// Quantize is the sender's rollout quantization (stages.Quantize):
	// with Scheme quant.FP8Block, the 2-D linear weights of every round
	// (or those its patterns pick) travel as F8_E4M3 codes and F32
	// _scale_inv tensors, quantized as they are packed: host weights on
	// the sender's CPU, device weights (SendRefs of CUDA tensors into
	// device buckets) on their GPU, with the same bytes. The zero value
	// sends tensors as they are.
	// Receivers need nothing: they get ordinary tensors. In JSON "quantize"
	// (the scheme), "quantize_include" and "quantize_exclude" (lists of
	// patterns).
	Quantize stages.QuantizeConfig `json:"-"`
	// NoDirect has the sender pack every bucket even where every receiver
	// shares its GPU and could read its device tensors in place
	// (stages.SenderConfig.NoDirect), to compare. In JSON "direct": false.
	NoDirect bool `json:"-"`
	// NoTurns has receivers that read the sender's tensors in place on
	// its GPU copy them all at once rather than taking turns where the GPU
	// is not shared through MPS (stages.SenderConfig.NoTurns), to
	// compare. In JSON "turns": false.
	NoTurns bool `json:"-"`
	// Device is where this rank's buckets live when the transport puts
	// them on a GPU: "cuda:N", or "" or "cuda" for the GPU of this rank's
	// place among the ranks on its host (LOCAL_RANK, as torchrun counts).
	// "cpu" keeps the rank off GPUs (auto then picks tcp).
	Device string `json:"device,omitempty"`
	// Advertise is the address other hosts reach this one at; the
	// metadata bus and the tcp chain then listen on every interface.
	Advertise string `json:"advertise,omitempty"`
	// Secret, when set, is the group secret every rank of the group holds
	// (auth.ReadSecretFile): every rendezvous record is signed with keys
	// derived from it for this run, every connection between ranks
	// proves that both ends hold it, every bucket carries a MAC of its
	// bytes that receivers check before using them, and every metadata
	// message is signed. Nil means no secret.
	Secret *auth.Secret `json:"-"`
	// SecretFile, when Secret is nil, names the file Validate reads the
	// group secret from (auth.ReadSecretFile: mode 0600); FromEnv takes it
	// from WEIGHTCAST_SECRET_FILE when both are unset.
	SecretFile string `json:"secret_file,omitempty"`
	// BucketMAC is the MAC the sender puts on every bucket when the group
	// has a secret (stages.SenderConfig.BucketMAC): "blake3" (keyed BLAKE3,
	// also ""), or "poly1305-aes" (Poly1305-AES under a random nonce per
	// bucket, whose GPU kernels do a fraction of BLAKE3's work per byte).
	// Receivers verify either, as each bucket's signed metadata says; the
	// setting matters only on the sender. Routed groups (Senders) MAC with
	// keyed BLAKE3 only.
	BucketMAC mac.Kind `json:"bucket_mac,omitempty"`
	// TLS, when its files are given, runs the connections that cross the
	// network — etcd (served over TLS by a rank 0 that serves it), the tcp
	// chain and the metadata bus — over mutual TLS 1.3. In JSON "tls_ca",
	// "tls_cert" and "tls_key".
	TLS auth.TLSFiles `json:"-"`
	// HostMemory allocates host bucket buffers; nil means Go memory
	// (mem.Host). The C library passes C memory, whose views may cross
	// to C.
	HostMemory mem.Device `json:"-"`
	// Tracer, when set, records every round's spans.
	Tracer *pipeline.Tracer `json:"-"`
	// Progress, when set, is called on the sender after each bucket has
	// moved.
	Progress func(*wire.BucketMeta) `json:"-"`
	// Endpoint, when set, is the byte transport this rank uses instead of
	// opening one (tests, custom pipelines), as http.Client.Transport
	// replaces the client's: every rank must be given an end of the same
	// transport. Transport then names the registered transport it is of,
	// whose rules say where buckets live (host memory or a GPU) and
	// whether the ranks meet at a rendezvous; "auto" reports it as
	// "custom", with buckets in host memory. The caller owns it: Close
	// does not close it; close it after the Sender or Receiver.
	Endpoint transport.Endpoint `json:"-"`
	// Publisher (rank 0) or Subscriber (every other rank), when set, is
	// the metadata bus end this rank uses instead of opening one of the
	// registered bus that serves its transport (transport.BusFor). The
	// caller owns it: Close does not close it; close it after the Sender
	// or Receiver (on rank 0 that ends the run for the receivers, as
	// Close does with a bus of its own).
	Publisher  transport.Publisher  `json:"-"`
	Subscriber transport.Subscriber `json:"-"`
	// Logger hears what a rank waits for while it waits to meet the
	// others (every rendezvous.NoticeEvery: "waiting for rank 2 to join
	// (2 of 3 joined), 1m40s left"; etcd not answering yet) and the
	// transports' warnings (connections refused before their handshake
	// completed, rate-limited). Nil means slog.Default(), which writes to
	// stderr; slog.New(slog.DiscardHandler) silences it.
	Logger *slog.Logger `json:"-"`
}

// FromEnv returns o with the settings it leaves unset taken from the
// torchrun variables in getenv: Rank (when negative) from RANK, WorldSize
// (when 0) from WORLD_SIZE, Rendezvous (when empty) from MASTER_ADDR and
// MASTER_PORT with rank 0 serving it, RunID (when empty) from
// TORCHELASTIC_RUN_ID unless it is torchrun's default "none" (a served
// rendezvous needs no run id), Device (when empty) "cuda:LOCAL_RANK", and
// SecretFile (when it and Secret are unset) from WEIGHTCAST_SECRET_FILE. A
// variable that is set but malformed is an error naming it.
func (o Options) FromEnv(getenv func(string) string) (Options, error) {
	num := func(name string) (int, bool, error) {
		v := getenv(name)
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, false, fmt.Errorf("%w: %s=%q is not a non-negative number", ErrConfig, name, v)
		}
		return n, true, nil
	}
	if o.Rank < 0 {
		n, ok, err := num("RANK")
		if err != nil {
			return o, err
		}
		if !ok {
			return o, fmt.Errorf("%w: no rank given and RANK is not set; pass the rank, or start the process with torchrun", ErrConfig)
		}
		o.Rank = n
	}
	if o.WorldSize == 0 {
		n, ok, err := num("WORLD_SIZE")
		if err != nil {
			return o, err
		}
		if !ok {
			return o, fmt.Errorf("%w: no world size given and WORLD_SIZE is not set; pass the world size, or start the process with torchrun", ErrConfig)
		}
		o.WorldSize = n
	}
	if d, ok := transport.Lookup(o.Transport); o.Rendezvous == "" && !(ok && d.InProcess) {
		host, port := getenv("MASTER_ADDR"), getenv("MASTER_PORT")
		switch {
		case host == "" && port == "":
			return o, fmt.Errorf("%w: no rendezvous given and MASTER_ADDR/MASTER_PORT are not set; pass rendezvous \"etcd://HOST:PORT\", or start the process with torchrun", ErrConfig)
		case host == "" || port == "":
			return o, fmt.Errorf("%w: MASTER_ADDR=%q and MASTER_PORT=%q: set both, as torchrun does", ErrConfig, host, port)
		}
		o.Rendezvous, o.ServeRendezvous = "etcd://"+net.JoinHostPort(host, port), true
	}
	if id := getenv("TORCHELASTIC_RUN_ID"); o.RunID == "" && id != "" && id != "none" {
		o.RunID = id
	}
	if o.Secret == nil && o.SecretFile == "" {
		o.SecretFile = getenv(auth.SecretFileEnv)
	}
	if o.Device == "" {
		n, ok, err := num("LOCAL_RANK")
		if err != nil {
			return o, err
		}
		if ok {
			o.Device = fmt.Sprintf("cuda:%d", n)
		}
	}
	return o, nil
}

// Validate fills in the defaults of the settings left unset (DefaultGroup,
// transport "auto", DefaultBucketSize, DefaultTimeout), reads the group
// secret from SecretFile when Secret is nil, and reports the first setting
// that cannot work as a *FieldError naming its JSON key (which matches
// ErrConfig). It checks what does not depend on the rank's place in the
// group: the rank, the world size and the rendezvous are checked when a
// Sender or Receiver opens. It is the one validation pass of every front
// end; calling it again changes nothing.
func (o *Options) Validate() error {
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	if o.Transport == "" {
		o.Transport = "auto"
	}
	if o.BucketSize == 0 {
		o.BucketSize = DefaultBucketSize
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	const maxBucket = 1 << 40
	switch {
	case o.BucketSize < stages.MinBucketSize:
		return fieldError("bucket", o.BucketSize, " is below the minimum of %s (a few hundred MiB is usual)", humanize.IBytes(stages.MinBucketSize))
	case o.BucketSize > maxBucket:
		return fieldError("bucket", o.BucketSize, " is over the limit of %s (a few hundred MiB is usual)", humanize.IBytes(maxBucket))
	case o.Timeout < 0:
		return fieldError("timeout", o.Timeout, ": give a positive duration")
	case !rendezvous.ValidName(o.Group):
		return fieldError("group", fmt.Sprintf("%q", o.Group), ": a group name must be 1 to 256 bytes, without '/', spaces or control characters")
	case o.RunID != "" && (!rendezvous.ValidName(o.RunID) || o.RunID == "owner"):
		return fieldError("run_id", fmt.Sprintf("%q", o.RunID), ": a run id must be 1 to 256 bytes, without '/', spaces or control characters, and not \"owner\"")
	}
	switch k, err := mac.ParseKind(string(o.BucketMAC)); {
	case err != nil:
		return fieldError("bucket_mac", fmt.Sprintf("%q", o.BucketMAC), `: choose %q or %q`, mac.BLAKE3, mac.Poly1305AES)
	case k == mac.Poly1305AES && o.Senders > 0:
		return fieldError("bucket_mac", fmt.Sprintf("%q", o.BucketMAC), ": a routed group (senders) MACs its pieces with keyed BLAKE3; leave bucket_mac out")
	}
	if _, known := transport.Lookup(o.Transport); o.Transport != "auto" && !known {
		return fieldError("transport", fmt.Sprintf("%q", o.Transport), ": choose %s", transportChoices())
	}
	switch {
	case o.Senders < 0:
		return fieldError("senders", o.Senders, ": give 0 (one sender broadcasting) or the number of sending ranks")
	case o.TP < 0:
		return fieldError("tp", o.TP, ": give the rollout's tensor-parallel size, 1 or more")
	case o.TPRank < 0 || o.TPRank >= max(o.TP, 1):
		return fieldError("tp_rank", o.TPRank, " is outside [0, %d) for tensor-parallel size %d", max(o.TP, 1), max(o.TP, 1))
	case o.TP > 1 && o.Senders == 0:
		return fieldError("tp", o.TP, ": a tensor-parallel receiver needs a routed group: give senders (1 or more) on every rank")
	case o.Heads < 0 || o.KVHeads < 0:
		return fieldError("kv_heads", o.KVHeads, ": head counts must not be negative")
	}
	for _, r := range o.TPRules {
		if _, err := layout.ParseRule(r); err != nil {
			return fieldError("tp_rules", fmt.Sprintf("%q", r), ": %v", err)
		}
	}
	if _, _, err := parseDevice(o.Device); err != nil {
		return err
	}
	switch o.RolloutDType {
	case dtype.Invalid, dtype.F32, dtype.BF16, dtype.F16:
	default:
		return fieldError("dtype", o.RolloutDType, ": choose BF16, F16 or F32 (floating tensors are cast to it), or none to send tensors as they are")
	}
	if q := o.Quantize; q.Scheme != "" || len(q.Include) > 0 || len(q.Exclude) > 0 {
		if _, err := stages.Quantize(source.Tensors{}, q); err != nil {
			fe := fieldError("quantize", nil, ": %v", err)
			fe.Err = err
			return fe
		}
	}
	if o.Secret == nil && o.SecretFile != "" {
		secret, err := auth.ReadSecretFile(o.SecretFile)
		if err != nil {
			fe := fieldError("secret_file", nil, ": %v", err)
			fe.Err = err
			return fe
		}
		o.Secret = secret
	}
	return nil
}

// check validates o (Validate) and this rank's place in the group for
// role, "sender" or "receiver".
func (o *Options) check(role string) error {
	bad := func(err error) error {
		return fmt.Errorf("%w: %s rank %d of group %q: %w", ErrConfig, role, o.Rank, o.Group, err)
	}
	if err := o.Validate(); err != nil {
		return bad(err)
	}
	switch {
	case o.WorldSize < 2:
		return bad(fieldError("world_size", o.WorldSize, ": a group needs a sender and at least one receiver"))
	case o.Rank < 0 || o.Rank >= o.WorldSize:
		return bad(fieldError("rank", o.Rank, " is outside a world of %d ranks (0..%d)", o.WorldSize, o.WorldSize-1))
	case o.Senders >= o.WorldSize:
		return bad(fieldError("senders", o.Senders, ": a group of %d ranks needs at least one receiver besides its senders", o.WorldSize))
	case o.Senders > 0 && role == "sender" && o.Rank >= o.Senders:
		return bad(fieldError("rank", o.Rank, ": the senders are ranks 0..%d of a routed group of %d senders; this rank receives", o.Senders-1, o.Senders))
	case o.Senders > 0 && role == "receiver" && o.Rank < o.Senders:
		return bad(fieldError("rank", o.Rank, ": ranks 0..%d send in a routed group of %d senders; receivers are ranks %d..%d", o.Senders-1, o.Senders, o.Senders, o.WorldSize-1))
	case o.Senders > 0 && o.Transport != "auto" && !routes(o.Transport):
		return bad(fieldError("transport", fmt.Sprintf("%q", o.Transport), ": it broadcasts from one root only, and a routed group (senders) needs one that moves buckets between pairs of ranks: %s", routedChoices()))
	case o.Senders > 0:
	case role == "sender" && o.Rank != 0:
		return bad(fieldError("rank", o.Rank, ": the sender is rank 0 (trainer ranks that do not send join nothing)"))
	case role == "receiver" && o.Rank == 0:
		return bad(fieldError("rank", o.Rank, ": rank 0 is the sender; receivers are ranks 1..%d", o.WorldSize-1))
	case role == "sender" && o.Subscriber != nil, role == "receiver" && o.Publisher != nil:
		return bad(errors.New("the sender publishes the metadata (Options.Publisher) and receivers subscribe (Options.Subscriber)"))
	}
	if d, _ := transport.Lookup(o.Transport); d.InProcess {
		if o.Rendezvous != "" {
			return bad(fieldError("rendezvous", fmt.Sprintf("%q", o.Rendezvous), ": transport %s runs every rank in this process and meets no rendezvous; leave it empty", d.Name))
		}
		return nil
	}
	if _, err := RendezvousAddr(o.Rendezvous); err != nil {
		return bad(err)
	}
	if o.RunID == "" && !o.ServeRendezvous {
		return bad(fieldError("run_id", nil, ": none given: give the same one to every rank of a launch and a new one to every launch (a job id, or TORCHELASTIC_RUN_ID under torchrun), or let rank 0 serve the rendezvous (MASTER_ADDR and MASTER_PORT, serve_rendezvous), which then needs none"))
	}
	return nil
}

// routes reports whether the transport called name has a point-to-point
// mode (transport.Descriptor.OpenPairs).
func routes(name string) bool {
	d, ok := transport.Lookup(name)
	return ok && d.OpenPairs != nil
}

// routedChoices lists the transports a routed group may use.
func routedChoices() string {
	var out []string
	for _, n := range transport.Names() {
		if routes(n) {
			out = append(out, n)
		}
	}
	return "auto or " + strings.Join(out, ", ")
}

// transportChoices lists what Options.Transport may be, for people:
// "auto, inproc, ipc, nccl or tcp".
func transportChoices() string {
	names := append([]string{"auto"}, transport.Names()...)
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// RendezvousAddr checks a rendezvous address, "etcd://HOST:PORT", and
// returns its HOST:PORT; a bad one is a *FieldError of "rendezvous".
func RendezvousAddr(u string) (string, error) {
	hp, ok := strings.CutPrefix(u, "etcd://")
	if !ok || hp == "" {
		return "", fieldError("rendezvous", fmt.Sprintf("%q", u), ": want etcd://HOST:PORT")
	}
	if _, _, err := net.SplitHostPort(hp); err != nil {
		return "", fieldError("rendezvous", fmt.Sprintf("%q", u), ": want etcd://HOST:PORT: %v", err)
	}
	return hp, nil
}

// parseDevice reads Options.Device: ordinal is -1 unless "cuda:N" names
// one; cpu reports "cpu".
func parseDevice(s string) (ordinal int, cpu bool, err error) {
	switch s = strings.ToLower(strings.TrimSpace(s)); s {
	case "", "cuda", "gpu":
		return -1, false, nil
	case "cpu", "host":
		return -1, true, nil
	}
	if n, ok := strings.CutPrefix(s, "cuda:"); ok {
		if i, err := strconv.Atoi(n); err == nil && i >= 0 {
			return i, false, nil
		}
	}
	return -1, false, fieldError("device", fmt.Sprintf("%q", s), `: want "cpu", "cuda" or "cuda:N"`)
}
