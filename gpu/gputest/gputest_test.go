package gputest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
)

var procs = Procs{Env: "WEIGHTCAST_GPUTEST_TEST_CHILD", Run: runChild}

func TestMain(m *testing.M) { procs.Main(m) }

// childConfig is what TestProcs hands its child.
type childConfig struct {
	Group Group
	Rank  int
	Word  string
}

// runChild publishes the word it was given under "word" and waits for
// rank 0 at a barrier.
func runChild(js string) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bad child config:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x := cfg.Group.Exchange(cfg.Rank)
	if err := x.Put(ctx, "word", []byte(cfg.Word)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := x.Barrier(ctx, "done", 2); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestProcs runs rank 1 in a child process through Procs and Group: the
// child reads its configuration, speaks through the group's exchange and
// exits cleanly.
func TestProcs(t *testing.T) {
	g := NewGroup(t, "gputest")
	kid := procs.Start(t, 1, childConfig{Group: g, Rank: 1, Word: "hello"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := g.Config(0, 2, gpu.Host{}, time.Second)
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
