package transport

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Opener opens a rank's Endpoint of one transport.
type Opener func(ctx context.Context, cfg Config) (Endpoint, error)

// Descriptor is what a byte transport tells the registry about itself:
// how to open it, what it needs of the ranks, and how "auto" weighs it.
// As with NCCL's transports, each carries its own can-connect check over
// two ranks' facts, and "auto" (Choose) takes the first by preference
// that can connect every pair.
type Descriptor struct {
	// Name is the registry name ("tcp", "nccl").
	Name string
	// Open opens a rank's Endpoint.
	Open Opener
	// OpenPairs, when set, opens a rank's side of the transport's
	// point-to-point mode (Pairs), which routed groups use; nil: the
	// transport broadcasts only.
	OpenPairs PairsOpener
	// Preference orders the transports Choose tries: lower first. Zero
	// means Choose never picks it; it is used only when named.
	Preference int
	// DeviceMemory says its bucket buffers live on a GPU: every rank
	// needs one.
	DeviceMemory bool
	// GPUPerRank says each rank needs a GPU of its own: no two ranks on
	// one host may share one (NCCL refuses two ranks on one GPU).
	GPUPerRank bool
	// InProcess says every rank is a goroutine of one process: the ranks
	// meet in the process, not at a rendezvous, and use an in-process
	// metadata bus (a Bus with InProcess).
	InProcess bool
	// Network says it listens for other hosts: it is handed the bind and
	// advertise settings (Config.Options "bind", "advertise") a rank is
	// given for the sockets other hosts connect to.
	Network bool
	// Facts, when set, returns what this transport adds to the facts a
	// rank publishes when it joins (beyond FactHost and FactGPUs, which
	// every rank publishes), so that CanConnect can judge it on every
	// rank. Its keys are part of the rendezvous records (docs/protocol.md).
	Facts func(Probe) map[string]string
	// CanConnect, when set, reports whether the transport can join ranks
	// a and b, from what each published. Nil: any two.
	CanConnect func(a, b Peer) bool
	// Reason, when set, says why Choose picked this transport for peers,
	// the transports before it having been unable to connect them. Nil
	// means "every rank can reach every other".
	Reason func(peers []Peer) string
}

// The facts every rank publishes when it joins, whatever the transport:
// the registry's rules (DeviceMemory, GPUPerRank) and the front door's
// choice of GPU read them.
const (
	// FactHost identifies the machine (HostIdentity): ranks with equal
	// ones share it.
	FactHost = "weightcast.host"
	// FactGPUs counts the GPUs the rank may use (0 when it keeps its
	// buckets in host memory, or was not asked to look).
	FactGPUs = "weightcast.gpus"
)

// Probe is what a transport's Facts is told about the rank it describes.
type Probe struct {
	// GPUs counts the GPUs this rank may use.
	GPUs int
	// Auto is set when the transport will be chosen by Choose: only then
	// need Facts look (load a library, say); otherwise it reports its
	// facts' negative values.
	Auto bool
}

// Peer is one rank's published facts.
type Peer struct {
	Rank  int
	Facts map[string]string
}

// Host is the rank's FactHost.
func (p Peer) Host() string { return p.Facts[FactHost] }

// GPUs is the rank's FactGPUs (0 when missing or malformed).
func (p Peer) GPUs() int {
	n, _ := strconv.Atoi(p.Facts[FactGPUs])
	return max(n, 0)
}

// HostIdentity names this machine for FactHost: the host name and, where
// the kernel has one, its boot id, so that two machines given the same
// name, or one rebooted, still differ.
func HostIdentity() string {
	host, _ := os.Hostname()
	if id, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		host += "/" + strings.TrimSpace(string(id))
	}
	return host
}

var (
	mu          sync.RWMutex
	descriptors = map[string]Descriptor{}
)

// Register makes a transport available by name, chosen only when named.
// It panics if the name is taken or open is nil, as registration happens
// in init. RegisterDescriptor registers one that describes itself.
func Register(name string, open Opener) {
	RegisterDescriptor(Descriptor{Name: name, Open: open})
}

// RegisterDescriptor makes the transport d describes available by its
// name. It panics if the name is empty or taken, Open is nil or
// Preference negative, as registration happens in init.
func RegisterDescriptor(d Descriptor) {
	mu.Lock()
	defer mu.Unlock()
	switch {
	case d.Name == "":
		panic("transport: RegisterDescriptor with no name")
	case d.Open == nil:
		panic("transport: Register of nil opener for " + d.Name)
	case d.Preference < 0:
		panic("transport: negative preference for " + d.Name)
	}
	if _, dup := descriptors[d.Name]; dup {
		panic("transport: Register called twice for " + d.Name)
	}
	descriptors[d.Name] = d
}

// Lookup returns the descriptor of the transport registered as name.
func Lookup(name string) (Descriptor, bool) {
	mu.RLock()
	defer mu.RUnlock()
	d, ok := descriptors[name]
	return d, ok
}

// Names lists the registered transports, sorted.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]string, 0, len(descriptors))
	for n := range descriptors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Candidates lists the transports Choose may pick, in the order it tries
// them: by Preference, then by name.
func Candidates() []Descriptor {
	mu.RLock()
	var out []Descriptor
	for _, d := range descriptors {
		if d.Preference > 0 {
			out = append(out, d)
		}
	}
	mu.RUnlock()
	slices.SortFunc(out, func(a, b Descriptor) int {
		if a.Preference != b.Preference {
			return a.Preference - b.Preference
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// ErrNoTransport is wrapped by Choose's error when no registered
// transport can connect every rank.
var ErrNoTransport = errors.New("no transport can connect every rank")

// Choose is "auto": the first transport of Candidates that can connect
// peers (every rank's facts, by rank), and why. Every rank that sees the
// same facts gets the same answer. A transport can connect them when
// every rank has a GPU if it keeps buckets on one (DeviceMemory), no host
// has more ranks than GPUs if it needs one per rank (GPUPerRank), and
// CanConnect holds for every pair of ranks.
func Choose(peers []Peer) (Descriptor, string, error) { return ChooseAmong(Candidates(), peers) }

// ChooseAmong is Choose over the transports cands, in that order, whether
// registered or not.
func ChooseAmong(cands []Descriptor, peers []Peer) (Descriptor, string, error) {
	for _, d := range cands {
		if d.connects(peers) {
			reason := "every rank can reach every other"
			if d.Reason != nil {
				reason = d.Reason(peers)
			}
			return d, reason, nil
		}
	}
	names := make([]string, len(cands))
	for i, d := range cands {
		names[i] = d.Name
	}
	return Descriptor{}, "", fmt.Errorf("transport auto: %w of %d (tried: %s)", ErrNoTransport, len(peers), strings.Join(names, ", "))
}

func (d Descriptor) connects(peers []Peer) bool {
	hosts := map[string]int{} // ranks per host
	for _, p := range peers {
		hosts[p.Host()]++
	}
	for _, p := range peers {
		if d.DeviceMemory && p.GPUs() == 0 || d.GPUPerRank && p.GPUs() < hosts[p.Host()] {
			return false
		}
	}
	if d.CanConnect == nil {
		return true
	}
	for i, a := range peers {
		for _, b := range peers[i+1:] {
			if !d.CanConnect(a, b) {
				return false
			}
		}
	}
	return true
}

// builtin maps each transport that ships with weightcast to the package
// whose import registers it. The registry cannot import them itself: they
// import this package, and ipc and nccl need cgo, which a program that moves
// host memory only does not.
var builtin = map[string]string{
	"inproc": "github.com/weightcast/weightcast/transport/inproc",
	"ipc":    "github.com/weightcast/weightcast/transport/ipc",
	"nccl":   "github.com/weightcast/weightcast/transport/ncclx",
	"tcp":    "github.com/weightcast/weightcast/transport/tcp",
}

// BuiltinPackage returns the import path of the package that registers the
// built-in transport called name, or "" when no built-in has that name.
func BuiltinPackage(name string) string { return builtin[name] }

// ErrUnknownTransport is wrapped by Open's error for a name no package
// registered.
var ErrUnknownTransport = errors.New("unknown transport")

// unknown explains a name that is not registered: for a built-in, the import
// that registers it; otherwise the built-in names.
func unknown(name string) error {
	registered := strings.Join(Names(), ", ")
	if registered == "" {
		registered = "none"
	}
	if pkg := BuiltinPackage(name); pkg != "" {
		return fmt.Errorf("transport: %w %q: it is built in but its package is not linked into this program; add `import _ %q` to it (registered: %s)", ErrUnknownTransport, name, pkg, registered)
	}
	names := make([]string, 0, len(builtin))
	for n := range builtin {
		names = append(names, n)
	}
	sort.Strings(names)
	return fmt.Errorf("transport: %w %q (registered: %s; built in: %s, each registered by importing its package)", ErrUnknownTransport, name, registered, strings.Join(names, ", "))
}

// Open validates cfg and opens this rank's Endpoint of the named transport.
// A name that no imported package registered fails with an error wrapping
// ErrUnknownTransport that, for a built-in transport, names the import to add.
func Open(ctx context.Context, name string, cfg Config) (Endpoint, error) {
	d, ok := Lookup(name)
	if !ok {
		return nil, unknown(name)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return d.Open(ctx, cfg)
}

// Bus is what a metadata bus tells the registry about itself.
type Bus struct {
	// Name is the registry name ("zmq", "inproc").
	Name string
	// OpenPublisher opens the root's side (cfg.Rank 0).
	OpenPublisher func(ctx context.Context, cfg Config) (Publisher, error)
	// OpenSubscriber opens a receiver's side (cfg.Rank 1 or more).
	OpenSubscriber func(ctx context.Context, cfg Config) (Subscriber, error)
	// InProcess says every rank is a goroutine of one process: it serves
	// transports with InProcess, and only those.
	InProcess bool
}

var buses = map[string]Bus{}

// RegisterBus makes a metadata bus available by name. It panics if the
// name is empty or taken or an opener is nil, as registration happens in
// init.
func RegisterBus(b Bus) {
	mu.Lock()
	defer mu.Unlock()
	if b.Name == "" || b.OpenPublisher == nil || b.OpenSubscriber == nil {
		panic("transport: RegisterBus of an incomplete bus " + strconv.Quote(b.Name))
	}
	if _, dup := buses[b.Name]; dup {
		panic("transport: RegisterBus called twice for " + b.Name)
	}
	buses[b.Name] = b
}

// BusFor returns the metadata bus for ranks of d: the registered bus, by
// name, whose InProcess matches d's.
func BusFor(d Descriptor) (Bus, error) {
	mu.RLock()
	defer mu.RUnlock()
	names := make([]string, 0, len(buses))
	for n := range buses {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if buses[n].InProcess == d.InProcess {
			return buses[n], nil
		}
	}
	where := "across processes"
	if d.InProcess {
		where = "in one process"
	}
	return Bus{}, fmt.Errorf("transport %s: no metadata bus %s is registered (registered: %s); import the package of one (transport/zmqbus, transport/inproc)", d.Name, where, strings.Join(names, ", "))
}

// HostCount counts the machines peers run on (distinct FactHost).
func HostCount(peers []Peer) int {
	hosts := map[string]bool{}
	for _, p := range peers {
		hosts[p.Host()] = true
	}
	return len(hosts)
}

// Descriptors lists every registered transport, sorted by name.
func Descriptors() []Descriptor {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]Descriptor, 0, len(descriptors))
	for _, d := range descriptors {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Descriptor) int { return strings.Compare(a.Name, b.Name) })
	return out
}
