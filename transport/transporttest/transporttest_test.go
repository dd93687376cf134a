package transporttest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/inproc"
)

var procs = Procs[childConfig]{Env: "WEIGHTCAST_TRANSPORTTEST_TEST_CHILD", Run: runChild}

func TestMain(m *testing.M) { Main(m, procs) }

// childConfig is what TestProcs hands its children.
type childConfig struct {
	Group Group
	Rank  int
	Word  string // "fail": the child fails
}

// runChild publishes the word it was given under "word" and waits for
// rank 0 at a barrier, or fails at once.
func runChild(cfg childConfig) error {
	if cfg.Word == "fail" {
		return errors.New("failing as told")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x := cfg.Group.Exchange(cfg.Rank)
	if err := x.Put(ctx, "word", []byte(cfg.Word)); err != nil {
		return err
	}
	return x.Barrier(ctx, "done", 2)
}

// TestProcs runs rank 1 in a child process through Procs and Group: the
// child reads its configuration, speaks through the group's exchange and
// exits cleanly.
func TestProcs(t *testing.T) {
	g := NewGroup(t, "transporttest")
	kid := procs.Start(t, 1, childConfig{Group: g, Rank: 1, Word: "hello"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := g.Config(0, 2, mem.Host{}, time.Second)
	if cfg.Group != g.Name || cfg.Rank != 0 || cfg.WorldSize != 2 || cfg.Timeout != time.Second {
		t.Fatalf("Config = %+v", cfg)
	}
	got, err := cfg.Exchange.Get(ctx, 1, "word")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "hello" {
		t.Fatalf("child published %q, want %q", got, "hello")
	}
	if err := g.Exchange(0).Barrier(ctx, "done", 2); err != nil {
		t.Fatal(err)
	}
	kid.Wait(t, 30*time.Second)
	if out := kid.Output(); !strings.Contains(out, "rank 1: ok") {
		t.Errorf("child printed %q; want it to say rank 1: ok", out)
	}
}

// TestProcsChildFails checks what a failing child says and how it exits,
// running the child's side in this process, and that a killed child's
// exit is told from a failure.
func TestProcsChildFails(t *testing.T) {
	if code := procs.child(`{"Word":"fail"}`, "3"); code != 1 {
		t.Errorf("a failing child exits with %d, want 1", code)
	}
	if code := procs.child(`{"Word":`, "3"); code != 2 {
		t.Errorf("a child with a bad configuration exits with %d, want 2", code)
	}
	g := NewGroup(t, "transporttest-kill")
	kid := procs.Start(t, 1, childConfig{Group: g, Rank: 1, Word: "waits"})
	kid.Kill()
	if err := kid.Exit(time.Second); !killed(err) {
		t.Errorf("a child ended by SIGKILL exited with %v, and killed says no", err)
	}
	if killed(nil) || killed(errors.New("exit status 1")) {
		t.Error("killed says yes to an exit that was no SIGKILL")
	}
}

// faulty wraps an inproc endpoint with one fault, so that the suite's
// cases can be shown to fail where a transport is wrong.
type faulty struct {
	transport.Endpoint
	cfg    transport.Config
	fault  string
	closed bool
}

func openFaulty(fault string) transport.Opener {
	return func(ctx context.Context, cfg transport.Config) (transport.Endpoint, error) {
		ep, err := inproc.Open(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return &faulty{Endpoint: ep, cfg: cfg, fault: fault}, nil
	}
}

func (f *faulty) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	switch {
	case f.fault == "usable after Close" && f.closed:
		return nil
	case f.fault == "impatient":
		return &transport.Error{Transport: "faulty", Group: f.cfg.Group, Rank: f.cfg.Rank, Op: "broadcast", Seq: seq, HasSeq: true,
			Peer: 1 - f.cfg.Rank, Err: transport.ErrTimeout}
	}
	err := f.Endpoint.Broadcast(ctx, seq, buf, n)
	var te *transport.Error
	switch {
	case f.fault == "blames no one" && errors.As(err, &te):
		te.Peer = -1
	case err != nil || f.cfg.Rank == 0:
	case f.fault == "flips a byte" && n > 0:
		buf.Host()[n/2] ^= 1
	case f.fault == "writes past the bucket" && n < buf.Len():
		buf.Host()[n] ^= 1
	}
	return err
}

func (f *faulty) Close() error {
	f.closed = true
	return f.Endpoint.Close()
}

// TestSuiteCatchesFaults runs cases of the suite against transports that
// are wrong in one way each: every case must fail, saying why.
func TestSuiteCatchesFaults(t *testing.T) {
	for _, c := range []struct {
		fault, scenario, want string
	}{
		{"flips a byte", "Buckets", "differs from the root's"},
		{"writes past the bucket", "Buckets", "past the bucket, changed"},
		{"usable after Close", "Close", "Broadcast after Close succeeded"},
		{"impatient", "TimeoutRoot", "; want it not before 900ms"},
		{"blames no one", "ReceiverGone", "want it to name peer rank 2 (Peer is -1)"},
	} {
		t.Run(c.fault, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s := &Suite{Name: inproc.Name, Open: openFaulty(c.fault), Memory: HostMemory{}, Ranks: Goroutines}
			err := s.goroutines(ctx, t.Name(), scenarioNamed(c.scenario), 4)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("case %s: %v; want a failure saying %q", c.scenario, err, c.want)
			}
			t.Log(err)
		})
	}
}

// TestRegistration: the suite finds a transport registered under another
// name than the one given, and a built-in name whose Open is not that
// package's.
func TestRegistration(t *testing.T) {
	if err := (&Suite{Name: inproc.Name, Open: inproc.Open}).registration(); err != nil {
		t.Errorf("inproc: %v", err)
	}
	if err := (&Suite{Name: "pigeon", Open: inproc.Open}).registration(); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Errorf("an unregistered name: %v", err)
	}
	err := (&Suite{Name: inproc.Name, Open: openFaulty("")}).registration()
	if err == nil || !strings.Contains(err.Error(), `the package of its Open is "github.com/weightcast/weightcast/transport/transporttest"`) {
		t.Errorf("a built-in name with another package's Open: %v", err)
	}
}

func TestBucketSizes(t *testing.T) {
	sizes := bucketSizes(4<<20 + 3)
	if sizes[0] != 0 || !slices.Contains(sizes, 4<<20+3) {
		t.Errorf("bucketSizes = %v; want 0 first and the largest among them", sizes)
	}
	for _, n := range bucketSizes(100) {
		if n > 100 {
			t.Errorf("bucketSizes(100) holds %d", n)
		}
	}
	if a, b := payload(1, 100), payload(2, 100); string(a) == string(b) {
		t.Error("two buckets in a row have the same payload")
	}
}
