package weightcast

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
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
// setting, so that new ones (a group secret, TLS) are new fields.
type Options struct {
	// Group names the sync group; one run at a time may hold it.
	// Empty means DefaultGroup.
	Group string
	// Rank is this process's place: 0 sends, 1..WorldSize-1 receive.
	Rank int
	// WorldSize counts the sender and every receiver (at least 2).
	WorldSize int
	// Rendezvous is where the ranks meet: "etcd://HOST:PORT". Empty only
	// with Transport "inproc", whose ranks are goroutines of one process.
	Rendezvous string
	// ServeRendezvous makes rank 0 serve an embedded etcd at Rendezvous's
	// address (torchrun's MASTER_ADDR:MASTER_PORT); the others dial it.
	ServeRendezvous bool
	// RunID names this launch: the same on every rank, new for every
	// launch, so that a crashed launch never blocks the next. With
	// ServeRendezvous it may be left empty: the rendezvous rank 0 serves
	// lives as long as the run, so rank 0 makes up a run id and publishes
	// it there, and the other ranks read it from the server they dial.
	RunID string
	// Transport moves the bucket bytes: "auto" (or empty), or the name of
	// a registered transport (transport.Names: the built-ins are "tcp",
	// "ipc", "nccl" and "inproc"). auto is decided from what every rank
	// reported when it joined, the same on all (transport.Choose): the
	// first registered transport, by preference, that can connect every
	// pair of ranks — nccl with a GPU per rank, ipc when the ranks share
	// one host's GPUs, tcp when some rank has no GPU.
	Transport string
	// BucketSize is the size of each of the two bucket buffers of every
	// rank, the same on all. 0 means DefaultBucketSize.
	BucketSize int64
	// Timeout bounds every wait: joining, each bucket, each
	// acknowledgement. 0 means DefaultTimeout.
	Timeout time.Duration
	// NoChecksum turns off the per-bucket checksum the sender computes
	// and every receiver checks.
	NoChecksum bool
	// RolloutDType, when valid, is the dtype the sender casts every
	// floating-point tensor (F32, BF16, F16) to before it is sent, on the
	// GPU for device tensors (stages.Cast): BF16 or F16 for a bf16 rollout
	// of an f32 trainer, as verl's rollout_dtype. dtype.Invalid (the zero
	// value) sends every tensor as it is.
	RolloutDType dtype.DType
	// Quantize is the sender's rollout quantization (stages.Quantize):
	// with Scheme quant.FP8Block, the 2-D linear weights of every round
	// (or those its patterns pick) travel as F8_E4M3 codes and F32
	// _scale_inv tensors, quantized as they are packed: host weights on
	// the sender's CPU, device weights (SendRefs of CUDA tensors into
	// device buckets) on their GPU, with the same bytes. The zero value
	// sends tensors as they are.
	// Receivers need nothing: they get ordinary tensors.
	Quantize stages.QuantizeConfig
	// NoDirect has the sender pack every bucket even where every receiver
	// shares its GPU and could read its device tensors in place
	// (stages.SenderConfig.NoDirect), to compare.
	NoDirect bool
	// Device is where this rank's buckets live when the transport puts
	// them on a GPU: "cuda:N", or "" or "cuda" for the GPU of this rank's
	// place among the ranks on its host (LOCAL_RANK, as torchrun counts).
	// "cpu" keeps the rank off GPUs (auto then picks tcp).
	Device string
	// Advertise is the address other hosts reach this one at; the
	// metadata bus and the tcp chain then listen on every interface.
	Advertise string
	// Secret, when set, is the group secret every rank of the group holds
	// (auth.ReadSecretFile): every rendezvous record is signed with keys
	// derived from it for this run, every connection between ranks
	// proves that both ends hold it, every bucket carries a MAC of its
	// bytes that receivers check before using them, and every metadata
	// message is signed. Nil means no secret.
	Secret *auth.Secret
	// TLS, when its files are given, runs the connections that cross the
	// network — etcd (served over TLS by a rank 0 that serves it), the tcp
	// chain and the metadata bus — over mutual TLS 1.3.
	TLS auth.TLSFiles
	// HostMemory allocates host bucket buffers; nil means Go memory
	// (mem.Host). The C library passes C memory, whose views may cross
	// to C.
	HostMemory mem.Device
	// Tracer, when set, records every round's spans.
	Tracer *pipeline.Tracer
	// Progress, when set, is called on the sender after each bucket has
	// moved.
	Progress func(*stages.BucketMeta)
	// Endpoint, when set, is the byte transport this rank uses instead of
	// opening one (tests, custom pipelines), as http.Client.Transport
	// replaces the client's: every rank must be given an end of the same
	// transport. Transport then names the registered transport it is of,
	// whose rules say where buckets live (host memory or a GPU) and
	// whether the ranks meet at a rendezvous; "auto" reports it as
	// "custom", with buckets in host memory. The caller owns it: Close
	// does not close it; close it after the Sender or Receiver.
	Endpoint transport.Endpoint
	// Publisher (rank 0) or Subscriber (every other rank), when set, is
	// the metadata bus end this rank uses instead of opening one of the
	// registered bus that serves its transport (transport.BusFor). The
	// caller owns it: Close does not close it; close it after the Sender
	// or Receiver (on rank 0 that ends the run for the receivers, as
	// Close does with a bus of its own).
	Publisher  transport.Publisher
	Subscriber transport.Subscriber
	// Logger hears what a rank waits for while it waits to meet the
	// others (every rendezvous.NoticeEvery: "waiting for rank 2 to join
	// (2 of 3 joined), 1m40s left"; etcd not answering yet) and the
	// transports' warnings (connections refused before their handshake
	// completed, rate-limited). Nil means slog.Default(), which writes to
	// stderr; slog.New(slog.DiscardHandler) silences it.
	Logger *slog.Logger
}

// FromEnv returns o with the settings it leaves unset taken from the
// torchrun variables in getenv: Rank (when negative) from RANK, WorldSize
// (when 0) from WORLD_SIZE, Rendezvous (when empty) from MASTER_ADDR and
// MASTER_PORT with rank 0 serving it, RunID (when empty) from
// TORCHELASTIC_RUN_ID unless it is torchrun's default "none" (a served
// rendezvous needs no run id), Device (when empty) "cuda:LOCAL_RANK". A
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

// check fills in defaults and reports options that cannot work.
func (o *Options) check(role string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s rank %d of group %q: %s", ErrConfig, role, o.Rank, o.Group, fmt.Sprintf(format, args...))
	}
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
	switch {
	case o.WorldSize < 2:
		return bad("world size %d: a group needs a sender and at least one receiver", o.WorldSize)
	case o.Rank < 0 || o.Rank >= o.WorldSize:
		return bad("rank outside a world of %d ranks (0..%d)", o.WorldSize, o.WorldSize-1)
	case role == "sender" && o.Rank != 0:
		return bad("the sender is rank 0 (trainer ranks that do not send join nothing)")
	case role == "receiver" && o.Rank == 0:
		return bad("rank 0 is the sender; receivers are ranks 1..%d", o.WorldSize-1)
	case o.BucketSize < stages.MinBucketSize || o.BucketSize > 1<<40:
		return bad("bucket size %d bytes: use between 1 KiB and 1 TiB (a few hundred MiB is usual)", o.BucketSize)
	case o.Timeout < 0:
		return bad("timeout %v: give a positive duration", o.Timeout)
	case !rendezvous.ValidName(o.Group) || o.RunID != "" && !rendezvous.ValidName(o.RunID):
		return bad("group %q and run id %q must be names of at most 256 bytes without '/', spaces or control characters", o.Group, o.RunID)
	}
	d, known := transport.Lookup(o.Transport)
	switch {
	case o.Transport != "auto" && !known:
		return bad("transport %q: choose %s", o.Transport, transportChoices())
	case role == "sender" && o.Subscriber != nil, role == "receiver" && o.Publisher != nil:
		return bad("the sender publishes the metadata (Options.Publisher) and receivers subscribe (Options.Subscriber)")
	case d.InProcess:
		if o.Rendezvous != "" {
			return bad("transport %s runs every rank in this process and meets no rendezvous; leave Rendezvous empty", d.Name)
		}
	default:
		if _, err := RendezvousAddr(o.Rendezvous); err != nil {
			return bad("%v", err)
		}
		if o.RunID == "" && !o.ServeRendezvous {
			return bad("no run id: give the same one to every rank of a launch and a new one to every launch (a job id, or TORCHELASTIC_RUN_ID under torchrun), or let rank 0 serve the rendezvous (MASTER_ADDR and MASTER_PORT, Options.ServeRendezvous), which then needs none")
		}
		if o.RunID == "owner" {
			return bad("run id \"owner\" is reserved")
		}
	}
	if _, _, err := parseDevice(o.Device); err != nil {
		return bad("%v", err)
	}
	switch o.RolloutDType {
	case dtype.Invalid, dtype.F32, dtype.BF16, dtype.F16:
	default:
		return bad("rollout dtype %s: choose BF16, F16 or F32 (floating tensors are cast to it), or none to send tensors as they are", o.RolloutDType)
	}
	return nil
}

// transportChoices lists what Options.Transport may be, for people:
// "auto, inproc, ipc, nccl or tcp".
func transportChoices() string {
	names := append([]string{"auto"}, transport.Names()...)
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// RendezvousAddr checks a rendezvous address, "etcd://HOST:PORT", and
// returns its HOST:PORT.
func RendezvousAddr(u string) (string, error) {
	hp, ok := strings.CutPrefix(u, "etcd://")
	if !ok || hp == "" {
		return "", fmt.Errorf("rendezvous %q: want etcd://HOST:PORT", u)
	}
	if _, _, err := net.SplitHostPort(hp); err != nil {
		return "", fmt.Errorf("rendezvous %q: want etcd://HOST:PORT: %v", u, err)
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
	return -1, false, fmt.Errorf("device %q: want \"cpu\", \"cuda\" or \"cuda:N\"", s)
}
