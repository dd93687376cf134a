package tcp

import (
	"fmt"

	"github.com/weightcast/weightcast/transport"
)

// Descriptor is how tcp describes itself to the registry: host memory,
// any ranks on any hosts, listening for other hosts (OptBind,
// OptAdvertise); "auto" takes it when no GPU transport can connect every
// rank.
var Descriptor = transport.Descriptor{
	Name: Name, Open: Open, OpenPairs: OpenPairs, Preference: 30, Network: true,
	Reason: func(peers []transport.Peer) string {
		for _, p := range peers {
			if p.GPUs() == 0 {
				return fmt.Sprintf("rank %d has no GPU", p.Rank)
			}
		}
		if n := transport.HostCount(peers); n > 1 {
			return fmt.Sprintf("%d hosts without one GPU and NCCL for every rank", n)
		}
		return "no GPU transport can connect every rank"
	},
}

func init() { transport.RegisterDescriptor(Descriptor) }
