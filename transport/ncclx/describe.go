package ncclx

import (
	"fmt"

	"github.com/weightcast/weightcast/nccl"
	"github.com/weightcast/weightcast/transport"
)

// FactNCCL is the fact a rank publishes when it joins: "1" when NCCL
// loads on it, "0" otherwise (or when it was not asked to look).
const FactNCCL = "weightcast.nccl"

// Descriptor is how nccl describes itself to the registry: buckets on a
// GPU of each rank's own (NCCL refuses two ranks on one GPU), NCCL
// loading on every rank, any number of hosts; "auto" tries it first. Its
// point-to-point mode (routed groups) is a two-rank communicator per
// sender–receiver pair (transport.PairsOf), its broadcast the pair's
// send and receive: the sender and the receiver of a pair must be on
// different GPUs, and a rank holds one communicator per peer.
var Descriptor = transport.Descriptor{
	Name: Name, Open: Open, OpenPairs: transport.PairsOf(Open), Preference: 10,
	DeviceMemory: true, GPUPerRank: true,
	Facts: func(p transport.Probe) map[string]string {
		ok := "0"
		if p.Auto && p.GPUs > 0 && nccl.Load(nccl.Options{}) == nil {
			ok = "1"
		}
		return map[string]string{FactNCCL: ok}
	},
	CanConnect: func(a, b transport.Peer) bool { return a.Facts[FactNCCL] == "1" && b.Facts[FactNCCL] == "1" },
	Reason: func(peers []transport.Peer) string {
		if n := transport.HostCount(peers); n > 1 {
			return fmt.Sprintf("%d hosts, one GPU per rank", n)
		}
		return fmt.Sprintf("%d GPUs, one per rank", peers[0].GPUs())
	},
}

func init() { transport.RegisterDescriptor(Descriptor) }
