package gputest

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
)

var procs = Procs[childConfig]{Env: "WEIGHTCAST_GPUTEST_TEST_CHILD", Run: runChild}

func TestMain(m *testing.M) { procs.Main(m) }

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
	g := NewGroup(t, "gputest")
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
// running the child's side in this process.
func TestProcsChildFails(t *testing.T) {
	if code := procs.child(`{"Word":"fail"}`, "3"); code != 1 {
		t.Errorf("a failing child exits with %d, want 1", code)
	}
	if code := procs.child(`{"Word":`, "3"); code != 2 {
		t.Errorf("a child with a bad configuration exits with %d, want 2", code)
	}
}

func TestFirstDiff(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", -1},
		{"abc", "abc", -1},
		{"abc", "abd", 2},
		{"xbc", "abc", 0},
		{"ab", "abc", 2},
		{"abc", "a", 1},
	} {
		if got := FirstDiff([]byte(c.a), []byte(c.b)); got != c.want {
			t.Errorf("FirstDiff(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestRandomBytes(t *testing.T) {
	a := RandomBytes(rand.New(rand.NewPCG(1, 2)), 1000)
	b := RandomBytes(rand.New(rand.NewPCG(1, 2)), 1000)
	if len(a) != 1000 || !bytes.Equal(a, b) {
		t.Fatal("RandomBytes is not a function of its generator")
	}
	if bytes.Count(a, a[:1]) == len(a) {
		t.Fatal("RandomBytes returned one byte repeated")
	}
}

// TestDevice needs a GPU: it uploads random bytes, fills a second buffer,
// and reads both back. Without one it checks that Device skips.
func TestDevice(t *testing.T) {
	d := Device(t)
	s := Stream(t, d)
	const n = 1<<20 + 3
	want := RandomBytes(rand.New(rand.NewPCG(3, 4)), n)
	a, b := Alloc(t, d, n), Alloc(t, d, n)
	Upload(t, s, a, 0, want)
	Fill(t, s, b, 0xA5)
	if got := Download(t, s, a, 0, n); !bytes.Equal(got, want) {
		t.Fatalf("round trip differs at byte %d", FirstDiff(got, want))
	}
	if got := Download(t, s, b, 1, n-1); !bytes.Equal(got, bytes.Repeat([]byte{0xA5}, n-1)) {
		t.Fatal("Fill left bytes unset")
	}
}
