package ipc

import (
	"fmt"

	"github.com/weightcast/weightcast/transport"
)

// Descriptor is how ipc describes itself to the registry: buckets on a
// GPU of every rank, every rank on one host (CUDA IPC handles do not
// cross machines), any number of ranks per GPU; "auto" tries it after
// nccl. Its point-to-point mode (routed groups) is a two-rank group per
// sender–receiver pair (transport.PairsOf).
var Descriptor = transport.Descriptor{
	Name: Name, Open: Open, OpenPairs: transport.PairsOf(Open), Preference: 20,
	DeviceMemory: true,
	CanConnect:   func(a, b transport.Peer) bool { return a.Host() == b.Host() },
	Reason: func(peers []transport.Peer) string {
		return fmt.Sprintf("%d ranks share %d GPU(s) of this host", len(peers), peers[0].GPUs())
	},
}

func init() { transport.RegisterDescriptor(Descriptor) }
