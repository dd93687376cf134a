package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
)

// TestGPUKilledReceiverInTurns: three receivers on the sender's GPU read
// its tensors in place and, without MPS, take turns, each waiting on the
// GPU for the one before it. One is killed with SIGKILL in the middle of
// the rounds, most likely within a turn, so that the next receiver's wait
// will never be met by it. The launcher must still exit 1 within a minute,
// far inside the ranks' two-minute timeout, with every survivor reporting
// why: the root and the survivors let every wait go when the round fails,
// and no rank stays stuck on the GPU.
func TestGPUKilledReceiverInTurns(t *testing.T) {
	if n, err := gpu.DeviceCount(); err != nil || n == 0 {
		t.Skipf("no GPU here (%v)", err)
	}
	l := startLaunch(t, "", "--json", "--transport", "ipc", "--devices", "0", "--ranks", "4",
		"--size", "2GiB", "--tensors", "100", "--bucket", "64MiB", "--rounds", "100000", "--timeout", "120s")
	l.waitLine(t, "round 5/", 120*time.Second)
	pids := l.rankPIDs(t)
	if err := syscall.Kill(pids[2], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if code := l.wait(t, 60*time.Second); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	t.Logf("exited %v after the kill", l.exitAt.Sub(killed).Round(time.Millisecond))
	s := l.summary(t)
	root := reported(s.PerRank, 0)
	if root == nil || len(root.Rounds) == 0 {
		t.Fatalf("the sender reported no round: %+v", s.PerRank)
	}
	if !root.MPS && root.Rounds[0].TurnBuckets == 0 {
		t.Fatalf("without MPS the receivers took no turns: %+v", root.Rounds[0])
	}
	t.Logf("%d rounds committed, turns of %d buckets (mps %v)", len(root.Rounds), root.Rounds[0].TurnBuckets, root.MPS)
	for _, r := range s.PerRank {
		switch {
		case r.Rank == 2:
			if !r.Unreported || !strings.Contains(r.Error, "SIGKILL") {
				t.Errorf("killed rank: unreported %v, error %q", r.Unreported, r.Error)
			}
		case r.Unreported || r.Error == "":
			t.Errorf("rank %d: unreported %v, error %q", r.Rank, r.Unreported, r.Error)
		case strings.Contains(r.Error, "deadline"):
			t.Errorf("rank %d waited out its deadline: %s", r.Rank, r.Error)
		}
	}
}
