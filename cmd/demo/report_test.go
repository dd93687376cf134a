package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testConfig is a small synthetic run's configuration.
func testConfig(t *testing.T, args ...string) *config {
	t.Helper()
	c, err := parseConfig(append([]string{"--size", "1MiB", "--tensors", "10", "--bucket", "64KiB"}, args...), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// table renders the summary of results as the demo prints it.
func table(c *config, results []*rankResult) string {
	var b strings.Builder
	summarize(c, "tcp", "test", "local processes", results).writeTable(&b)
	return b.String()
}

func rounds(n int) []roundResult {
	out := make([]roundResult, n)
	for i := range out {
		out[i] = roundResult{Version: uint64(i + 1), Seconds: 0.5}
	}
	return out
}

// TestTableOneReceiverOneRound: singular forms.
func TestTableOneReceiverOneRound(t *testing.T) {
	c := testConfig(t, "--ranks", "2", "--rounds", "1")
	out := table(c, []*rankResult{
		{Rank: 0, Rounds: rounds(1), CommittedVersion: 1, Verified: true},
		{Rank: 1, Rounds: rounds(1), CommittedVersion: 1, Verified: true, VerifyScope: "every round"},
	})
	for _, want := range []string{"2 ranks (1 sender, 1 receiver)", "(1 receiver, 1 round finished)", "every byte on 1 receiver (every round)", "committed:     version 1 on every receiver\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, wrong := range []string{"1 receivers", "1 rounds", "FAILED"} {
		if strings.Contains(out, wrong) {
			t.Errorf("table says %q:\n%s", wrong, out)
		}
	}
}

// TestTableFailedRun: a run in which no round finished claims no rate, no
// verification and no checked checksums, and a rank that never reported is
// shown as such, not as version 0.
func TestTableFailedRun(t *testing.T) {
	c := testConfig(t, "--ranks", "3", "--rounds", "3")
	out := table(c, []*rankResult{
		{Rank: 0, Error: "round 1: boom"},
		{Rank: 1, Error: "round 1: boom", State: "intact"},
		{Rank: 2, Unreported: true, Error: "the rank's process was killed by SIGKILL before it reported"},
	})
	for _, want := range []string{"median rate:   none: no round finished", "verified:      no: the run did not finish", "rank 2: no report",
		"checksums:     on; no version was committed", "committed:     no version on every receiver", "rank 1: no version, model intact", "rank 2: no report (the rank's process was killed by SIGKILL", "FAILED:\n  rank 0: round 1: boom\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "buffers held:  none taken on any rank that reported") {
		t.Errorf("table does not say no buffer was taken:\n%s", out)
	}
	for _, wrong := range []string{"GB/s", "every bucket, checked by every receiver", "version 0", "  round  seconds", "at most 0"} {
		if strings.Contains(out, wrong) {
			t.Errorf("table says %q:\n%s", wrong, out)
		}
	}
}

// TestSummaryCommittedBySender: the group's committed version is the
// sender's, not the lowest figure of the ranks, and a rank with no report
// does not count as 0.
func TestSummaryCommittedBySender(t *testing.T) {
	c := testConfig(t, "--ranks", "4", "--rounds", "5")
	results := []*rankResult{
		{Rank: 0, Rounds: rounds(2), CommittedVersion: 2, Error: "round 3: rank 2 gone"},
		{Rank: 1, Rounds: rounds(2), CommittedVersion: 2, Error: "round 3: peer gone", VerifyScope: "every round"},
		{Rank: 2, Unreported: true, Error: "killed"},
		{Rank: 3, Rounds: rounds(3), CommittedVersion: 3, Error: "round 4: peer gone", VerifyScope: "every round"},
	}
	s := summarize(c, "tcp", "test", "local processes", results)
	if s.Committed == nil || *s.Committed != 2 || len(s.Seconds) != 2 || s.GBps == nil || s.Verified || s.ExitStatus != exitFailed {
		t.Fatalf("committed %v, %d round times, rate %v, verified %v, exit %d", s.Committed, len(s.Seconds), s.GBps, s.Verified, s.ExitStatus)
	}
	// Without the sender's report, the lowest receiver's.
	s = summarize(c, "tcp", "test", "local processes", []*rankResult{{Rank: 0, Unreported: true, Error: "killed"}, results[1], results[2], results[3]})
	if s.Committed == nil || *s.Committed != 2 || s.GBps != nil || len(s.Seconds) != 0 {
		t.Fatalf("without the sender: committed %v, rate %v, %d round times", s.Committed, s.GBps, len(s.Seconds))
	}
	var b strings.Builder
	s.writeTable(&b)
	if !strings.Contains(b.String(), "median rate:   not measured: the sender did not report") {
		t.Errorf("table:\n%s", b.String())
	}
	// Nobody reported: unknown, not 0.
	s = summarize(c, "tcp", "test", "local processes", []*rankResult{{Rank: 0, Unreported: true}, {Rank: 1, Unreported: true}})
	if s.Committed != nil {
		t.Fatalf("committed %d with no report", *s.Committed)
	}
}

// TestSummaryStopped: a stopped run exits with the signal's status and
// lists as failures only the ranks that failed for another reason.
func TestSummaryStopped(t *testing.T) {
	c := testConfig(t, "--ranks", "2", "--rounds", "5")
	s := summarize(c, "tcp", "test", "local processes", []*rankResult{
		{Rank: 0, Rounds: rounds(2), CommittedVersion: 2, Error: "round 3: stopped by SIGTERM", Stopped: "SIGTERM"},
		{Rank: 1, Rounds: rounds(2), CommittedVersion: 2, Error: "round 3: stopped by SIGTERM", Stopped: "SIGTERM", VerifyScope: "every round"},
	})
	s.stop(stopSignal{sig: 2})
	var b strings.Builder
	s.writeTable(&b)
	out := b.String()
	if s.ExitStatus != 130 || s.Stopped != "SIGINT" || !strings.Contains(out, "STOPPED by SIGINT during round 3") || strings.Contains(out, "FAILED") {
		t.Fatalf("exit %d, stopped %q:\n%s", s.ExitStatus, s.Stopped, out)
	}
	if !strings.Contains(out, "checksums:     every bucket of the 2 versions committed") {
		t.Errorf("checksums line:\n%s", out)
	}
}

// TestSummarySecret: with a group secret the table says every bucket's MAC
// was checked, and, when the receivers read buckets in place, that only
// the packed buckets carried checksums (a direct bucket's MAC stands in).
func TestSummarySecret(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testConfig(t, "--ranks", "2", "--rounds", "2", "--secret-file", secret)
	for _, tc := range []struct {
		direct    int
		checksums string
	}{
		{0, "checksums:     every bucket, checked by every receiver"},
		{3, "checksums:     every packed bucket (a direct bucket's MAC stood in for its checksum), checked by every receiver"},
	} {
		rs := rounds(2)
		rs[1].Direct = tc.direct
		s := summarize(c, "ipc", "test", "local processes", []*rankResult{
			{Rank: 0, Rounds: rs, CommittedVersion: 2},
			{Rank: 1, Rounds: rounds(2), CommittedVersion: 2, VerifyScope: "every round"},
		})
		var b strings.Builder
		s.writeTable(&b)
		out := b.String()
		if !s.MAC || s.BucketMAC != "blake3" || !strings.Contains(out, "MACs:          every bucket (keyed BLAKE3), checked by every receiver") || !strings.Contains(out, tc.checksums) {
			t.Errorf("%d direct buckets: mac %v, table:\n%s", tc.direct, s.MAC, out)
		}
	}
	if s := summarize(testConfig(t), "ipc", "test", "local processes", nil); s.MAC || s.BucketMAC != "" {
		t.Error("a run without a secret claims MACs")
	}
	p := summarize(testConfig(t, "--ranks", "2", "--secret-file", secret, "--bucket-mac", "poly1305-aes"), "ipc", "test", "local processes", nil)
	var b strings.Builder
	p.writeTable(&b)
	if p.BucketMAC != "poly1305-aes" || !strings.Contains(b.String(), "(Poly1305-AES)") {
		t.Errorf("--bucket-mac poly1305-aes: %q, table:\n%s", p.BucketMAC, b.String())
	}
}

func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 rounds", 1: "1 round", 2: "2 rounds"} {
		if got := plural(n, "round"); got != want {
			t.Errorf("plural(%d) = %q, want %q", n, got, want)
		}
	}
	if got := plural(3, "rank process"); got != "3 rank processes" {
		t.Errorf("got %q", got)
	}
	if got := plural(2, "directory"); got != "2 directories" {
		t.Errorf("got %q", got)
	}
}

// TestTableThisRankOnly: a process that ran one rank (--rank) claims only
// what it knows: a receiver its own check, memory and buffers, and that
// the sender times the rounds; the sender its rates, and that the
// receivers verify.
func TestTableThisRankOnly(t *testing.T) {
	rankArgs := func(r string) []string {
		return []string{"--rank", r, "--world-size", "3", "--rendezvous", "etcd://127.0.0.1:1", "--run-id", "x", "--rounds", "2"}
	}
	recv := testConfig(t, rankArgs("1")...)
	out := table(recv, []*rankResult{{Rank: 1, Rounds: rounds(2), CommittedVersion: 2, Verified: true, VerifyScope: "every round", MaxBuffers: 2, PeakRSS: 40 << 20}})
	for _, want := range []string{"median rate:   not known here: the sender (rank 0) times the rounds", "verified:      yes, every byte on this rank (rank 1; every round)",
		"buffers held:  at most 2 on this rank", "peak memory:   40 MiB RSS on this rank", "as rank 1 saw it"} {
		if !strings.Contains(out, want) {
			t.Errorf("receiver's table lacks %q:\n%s", want, out)
		}
	}
	for _, wrong := range []string{"the sender did not report", "largest rank", "on 2 receivers", "per rank"} {
		if strings.Contains(out, wrong) {
			t.Errorf("receiver's table says %q:\n%s", wrong, out)
		}
	}
	if s := summarize(recv, "tcp", "test", "rank 1", []*rankResult{{Rank: 1, Rounds: rounds(2), CommittedVersion: 2, Verified: true}}); s.Scope != "this rank" || !s.Verified {
		t.Errorf("receiver's JSON scope %q, verified %v; want this rank, true", s.Scope, s.Verified)
	}

	send := testConfig(t, rankArgs("0")...)
	results := []*rankResult{{Rank: 0, Rounds: rounds(2), CommittedVersion: 2, MaxBuffers: 2, PeakRSS: 40 << 20}}
	out = table(send, results)
	for _, want := range []string{"GB/s per receiver (2 receivers, 2 rounds finished)", "verified:      by each receiver, in its own summary (this process is the sender)", "on this rank"} {
		if !strings.Contains(out, want) {
			t.Errorf("sender's table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "every byte on") {
		t.Errorf("the sender claims the receivers' verification:\n%s", out)
	}
	if s := summarize(send, "tcp", "test", "rank 0", results); s.Scope != "this rank" || s.Verified {
		t.Errorf("sender's JSON scope %q, verified %v; want this rank, false (it checks nothing)", s.Scope, s.Verified)
	}
	// A rank that failed before it took a buffer.
	out = table(recv, []*rankResult{{Rank: 1, Error: "joining: boom"}})
	if !strings.Contains(out, "buffers held:  none taken on this rank") || strings.Contains(out, "at most 0") {
		t.Errorf("failed rank's table:\n%s", out)
	}
}
