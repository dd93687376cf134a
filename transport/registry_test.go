package transport_test

import (
	"errors"
	"strconv"
	"testing"

	"github.com/weightcast/weightcast/transport"
)

func peer(rank int, host string, gpus int) transport.Peer {
	return transport.Peer{Rank: rank, Facts: map[string]string{transport.FactHost: host, transport.FactGPUs: strconv.Itoa(gpus), "fast": "1"}}
}

// TestChooseAmong: the first transport that connects every pair wins; a
// transport on GPUs needs one on every rank, one per rank needs as many
// on each host as it has ranks, and CanConnect is asked of every pair.
func TestChooseAmong(t *testing.T) {
	fast := transport.Descriptor{Name: "fast", Preference: 1, DeviceMemory: true, GPUPerRank: true,
		CanConnect: func(a, b transport.Peer) bool { return a.Facts["fast"] == "1" && b.Facts["fast"] == "1" }}
	local := transport.Descriptor{Name: "local", Preference: 2, DeviceMemory: true,
		CanConnect: func(a, b transport.Peer) bool { return a.Host() == b.Host() },
		Reason:     func(ps []transport.Peer) string { return strconv.Itoa(len(ps)) + " ranks on one host" }}
	plain := transport.Descriptor{Name: "plain", Preference: 3}
	all := []transport.Descriptor{fast, local, plain}
	slow := peer(2, "a", 4)
	slow.Facts["fast"] = "0"
	for _, c := range []struct {
		peers        []transport.Peer
		want, reason string
	}{
		{[]transport.Peer{peer(0, "a", 2), peer(1, "a", 2)}, "fast", "every rank can reach every other"},
		{[]transport.Peer{peer(0, "a", 1), peer(1, "a", 1)}, "local", "2 ranks on one host"},              // one GPU for two ranks
		{[]transport.Peer{peer(0, "a", 4), peer(1, "a", 4), slow}, "local", "3 ranks on one host"},        // one pair cannot
		{[]transport.Peer{peer(0, "a", 1), peer(1, "b", 0)}, "plain", "every rank can reach every other"}, // a rank without a GPU
		{[]transport.Peer{peer(0, "a", 1), peer(1, "b", 1)}, "fast", "every rank can reach every other"},
	} {
		d, why, err := transport.ChooseAmong(all, c.peers)
		if err != nil || d.Name != c.want || why != c.reason {
			t.Errorf("%v: %s (%s), %v; want %s (%s)", c.peers, d.Name, why, err, c.want, c.reason)
		}
	}
	if _, _, err := transport.ChooseAmong([]transport.Descriptor{fast, local}, []transport.Peer{peer(0, "a", 0), peer(1, "a", 0)}); !errors.Is(err, transport.ErrNoTransport) {
		t.Errorf("no transport fits: %v; want ErrNoTransport", err)
	}
}

// TestBusFor: with no bus registered (this test binary links none),
// BusFor fails.
func TestBusFor(t *testing.T) {
	_, err := transport.BusFor(transport.Descriptor{Name: "x"})
	if err == nil {
		t.Fatal("BusFor with no bus registered succeeded")
	}
}
