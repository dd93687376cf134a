package plan

import (
	"errors"
	"fmt"
)

// Links is the link model. Senders sit on GPUs 0..S-1, GPUsPerNode to a
// node; receivers start on the next empty node (trainer and rollout do not
// share GPUs). Bytes between two GPUs of one node go over NVLink, other
// bytes over the sender's and the receiver's NIC. Every link is full duplex:
// a GPU's sending and receiving are separate links.
type Links struct {
	GPUsPerNode int     // GPUs per node; 1 or less: a node per GPU
	NIC         float64 // bytes per second per GPU to other nodes, each direction
	NVLink      float64 // bytes per second per GPU inside its node, each direction
	// Latency is the seconds added on a link for each sender–receiver pair
	// whose bytes use it (the start of one stream of buckets). The greedy
	// choice ignores it; predicted times include it.
	Latency float64
	// Colocated puts receiver r on sender r's GPU (trainer and rollout
	// sharing GPUs, one process each): bytes a GPU keeps cost no link.
	Colocated bool
}

// local is the link of bytes that stay on one GPU.
const local = -1

// Validate reports link speeds a plan cannot use.
func (l Links) Validate() error {
	switch {
	case !(l.NIC > 0):
		return errors.New("the NIC speed must be positive")
	case l.GPUsPerNode > 1 && !(l.NVLink > 0):
		return fmt.Errorf("the NVLink speed must be positive with %d GPUs per node", l.GPUsPerNode)
	case l.Latency < 0:
		return errors.New("the latency must not be negative")
	}
	return nil
}

func (l Links) gpn() int { return max(l.GPUsPerNode, 1) }

// link kinds, four per GPU.
const (
	nicOut = iota
	nicIn
	nvOut
	nvIn
	linksPerGPU
)

var linkNames = [linksPerGPU]string{"NIC out", "NIC in", "NVLink out", "NVLink in"}

// topo places ranks on GPUs and nodes.
type topo struct {
	l        Links
	senders  int
	recvBase int // GPU of receiver 0
}

func newTopo(l Links, senders int) topo {
	g := l.gpn()
	if l.Colocated {
		return topo{l: l, senders: senders}
	}
	return topo{l: l, senders: senders, recvBase: (senders + g - 1) / g * g}
}

func (t topo) senderGPU(s int) int   { return s }
func (t topo) receiverGPU(r int) int { return t.recvBase + r }
func (t topo) node(gpu int) int      { return gpu / t.l.gpn() }

// pair returns the sending and receiving link of bytes from sender s to
// receiver r, local for both when they share a GPU.
func (t topo) pair(s, r int) (out, in int) {
	a, b := t.senderGPU(s), t.receiverGPU(r)
	if a == b {
		return local, local
	}
	if t.l.gpn() > 1 && t.node(a) == t.node(b) {
		return a*linksPerGPU + nvOut, b*linksPerGPU + nvIn
	}
	return a*linksPerGPU + nicOut, b*linksPerGPU + nicIn
}

func (t topo) speed(link int) float64 {
	if k := link % linksPerGPU; k == nvOut || k == nvIn {
		return t.l.NVLink
	}
	return t.l.NIC
}

// describe names a link for a person: "sender 3 NIC out".
func (t topo) describe(link int) string {
	gpu, k := link/linksPerGPU, link%linksPerGPU
	if t.l.Colocated {
		return fmt.Sprintf("GPU %d %s", gpu, linkNames[k])
	}
	if gpu < t.recvBase {
		return fmt.Sprintf("sender %d %s", gpu, linkNames[k])
	}
	return fmt.Sprintf("receiver %d %s", gpu-t.recvBase, linkNames[k])
}

// sharesNode reports whether sender s and receiver r sit on one node.
func (t topo) sharesNode(s, r int) bool {
	return t.l.gpn() > 1 && t.node(t.senderGPU(s)) == t.node(t.receiverGPU(r))
}
