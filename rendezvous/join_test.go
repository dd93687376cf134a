package rendezvous_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth/authtest"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
	"github.com/weightcast/weightcast/rendezvous/rendezvoustest"
	"github.com/weightcast/weightcast/transport"
)

type joinResult struct {
	g     *rendezvous.Group
	err   error
	store rendezvous.Store
	took  time.Duration
}

type rankSpec struct {
	opts  rendezvous.JoinOptions
	delay time.Duration // before this rank starts
}

// joinRanks runs the ranks' Joins concurrently, each on its own store
// from open, and returns their results in order. Groups are closed at the
// end of the test.
func joinRanks(t *testing.T, open func() rendezvous.Store, specs []rankSpec) []joinResult {
	t.Helper()
	res := make([]joinResult, len(specs))
	for i := range specs {
		res[i].store = open()
	}
	var wg sync.WaitGroup
	for i, sp := range specs {
		wg.Go(func() {
			time.Sleep(sp.delay)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			start := time.Now()
			res[i].g, res[i].err = rendezvous.Join(ctx, res[i].store, sp.opts)
			res[i].took = time.Since(start)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, r := range res {
			if r.g != nil {
				r.g.Close()
			}
		}
	})
	return res
}

func world(group, run string, n int, timeout time.Duration) []rankSpec {
	specs := make([]rankSpec, n)
	for r := range n {
		specs[r].opts = rendezvous.JoinOptions{Group: group, RunID: run, Rank: r, WorldSize: n, Timeout: timeout,
			Endpoints: map[string]string{"meta": fmt.Sprintf("10.0.0.%d:%d", r, 7000+r), "rank": fmt.Sprint(r)}}
	}
	return specs
}

func etcdOpener(t *testing.T, e *embedetcd.Server, ttl time.Duration) func() rendezvous.Store {
	return func() rendezvous.Store { return dial(t, []string{e.ClientURL()}, ttl) }
}

func asError(t *testing.T, err error) *rendezvous.Error {
	t.Helper()
	var re *rendezvous.Error
	if !errors.As(err, &re) {
		t.Fatalf("error %v (%T) is not a *rendezvous.Error", err, err)
	}
	return re
}

func TestJoin8Embedded(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	testJoin8(t, etcdOpener(t, e, 5*time.Second))
}

func TestJoin8Mem(t *testing.T) {
	t.Parallel()
	m := rendezvoustest.NewMem()
	testJoin8(t, func() rendezvous.Store { return m.NewStore() })
}

func testJoin8(t *testing.T, open func() rendezvous.Store) {
	const n = 8
	res := joinRanks(t, open, world("g8", "run-1", n, 20*time.Second))
	for r, x := range res {
		if x.err != nil {
			t.Fatalf("rank %d: %v", r, x.err)
		}
	}
	uid := res[0].g.UniqueID()
	if uid == ([128]byte{}) {
		t.Fatal("unique id is all zeros")
	}
	for r, x := range res {
		g := x.g
		if g.Rank() != r || g.WorldSize() != n || g.Name() != "g8" || g.RunID() != "run-1" {
			t.Fatalf("rank %d's group says rank %d world %d group %q run %q", r, g.Rank(), g.WorldSize(), g.Name(), g.RunID())
		}
		if g.UniqueID() != uid {
			t.Fatalf("rank %d sees another unique id than rank 0", r)
		}
		for p := range n {
			if v, ok := g.Endpoint(p, "meta"); !ok || v != fmt.Sprintf("10.0.0.%d:%d", p, 7000+p) {
				t.Fatalf("rank %d sees rank %d's meta endpoint as %q, %v", r, p, v, ok)
			}
			if eps := g.Endpoints(p); len(eps) != 2 || eps["rank"] != fmt.Sprint(p) {
				t.Fatalf("rank %d sees rank %d's endpoints as %v", r, p, eps)
			}
		}
		if _, ok := g.Endpoint(0, "nope"); ok {
			t.Fatal("an endpoint nobody published was found")
		}
		if err := g.Err(); err != nil {
			t.Fatalf("rank %d: group broken right after join: %v", r, err)
		}
	}

	// The Group is the transports' Exchange: all-to-all Put and Get, then
	// a barrier.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for r, x := range res {
		var ex transport.Exchange = x.g
		wg.Go(func() {
			if err := ex.Put(ctx, "tcp/addr", []byte(fmt.Sprintf("addr-of-%d", r))); err != nil {
				errs <- err
				return
			}
			for p := range n {
				v, err := ex.Get(ctx, (r+p)%n, "tcp/addr")
				if err != nil {
					errs <- err
					return
				}
				if want := fmt.Sprintf("addr-of-%d", (r+p)%n); string(v) != want {
					errs <- fmt.Errorf("rank %d got %q from rank %d; want %q", r, v, (r+p)%n, want)
					return
				}
			}
			if err := x.g.Barrier(ctx, "exchanged"); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := res[3].g.Put(ctx, "tcp/addr", []byte("again")); !errors.Is(err, rendezvous.ErrDuplicateKey) {
		t.Fatalf("second Put of a key = %v; want ErrDuplicateKey", err)
	}
	// A key another writer created before this rank published it is not
	// this rank's mistake: ErrTampered, saying another writer did it.
	other := open()
	defer other.Close()
	if _, _, err := other.Create(ctx, rendezvous.KeyPrefix+"g8/run-1/data/2/tcp.addr", []byte("127.0.0.1:9")); err != nil {
		t.Fatal(err)
	}
	err := res[2].g.Put(ctx, "tcp.addr", []byte("10.0.0.2:7002"))
	if re := asError(t, err); !errors.Is(err, rendezvous.ErrTampered) || errors.Is(err, rendezvous.ErrDuplicateKey) || len(re.Ranks) != 0 ||
		!strings.Contains(err.Error(), "another writer created the key first") || strings.Contains(err.Error(), "twice") {
		t.Fatalf("Put of a key another writer created = %v; want ErrTampered saying another writer created it", err)
	}
	if _, err := other.DeleteIf(ctx, rendezvous.KeyPrefix+"g8/run-1/data/2/tcp.addr", []byte("127.0.0.1:9")); err != nil {
		t.Fatal(err)
	}

	// Rank 0 ends the run: the others see it gone, naming rank 0.
	if err := res[0].g.Close(); err != nil {
		t.Fatalf("rank 0 close: %v", err)
	}
	for r, x := range res[1:] {
		select {
		case <-x.g.PeerGone():
		case <-time.After(10 * time.Second):
			t.Fatalf("rank %d: PeerGone not closed within 10s of rank 0's Close", r+1)
		}
		if re := asError(t, x.g.Err()); !errors.Is(re, rendezvous.ErrPeerGone) || !slices.Equal(re.Ranks, []int{0}) {
			t.Fatalf("rank %d after rank 0 closed: %v; want ErrPeerGone naming rank 0", r+1, re)
		}
		if err := x.g.Close(); err != nil {
			t.Fatalf("rank %d close: %v", r+1, err)
		}
		if err := x.g.Close(); err != nil {
			t.Fatalf("rank %d second close: %v", r+1, err)
		}
		if err := x.g.Barrier(ctx, "late"); !errors.Is(err, rendezvous.ErrClosed) {
			t.Fatalf("barrier after close = %v; want ErrClosed", err)
		}
	}
	// Nothing of the group is left behind.
	s := open()
	defer s.Close()
	left, err := s.List(ctx, rendezvous.KeyPrefix+"g8/")
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("keys left after every rank closed: %q", slices.Sorted(func(yield func(string) bool) {
			for k := range left {
				if !yield(k) {
					return
				}
			}
		}))
	}
}

func TestJoinRootLate(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	specs := world("late", "r", 4, 20*time.Second)
	const late = 3 * time.Second
	specs[0].delay = late
	res := joinRanks(t, etcdOpener(t, e, 5*time.Second), specs)
	for r, x := range res {
		if x.err != nil {
			t.Fatalf("rank %d: %v", r, x.err)
		}
		if r > 0 && x.took < late-100*time.Millisecond {
			t.Fatalf("rank %d joined after %v, before rank 0 even started", r, x.took)
		}
		if x.g.UniqueID() != res[0].g.UniqueID() {
			t.Fatalf("rank %d sees another unique id", r)
		}
	}
}

func TestJoinTimeoutNamesMissingRanks(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	open := etcdOpener(t, e, 5*time.Second)
	const timeout = 1500 * time.Millisecond

	// Rank 3 of 4 never comes.
	res := joinRanks(t, open, world("timeout", "r", 4, timeout)[:3])
	for r, x := range res {
		re := asError(t, x.err)
		if !errors.Is(x.err, rendezvous.ErrTimeout) || !errors.Is(x.err, transport.ErrTimeout) {
			t.Fatalf("rank %d: %v; want ErrTimeout", r, x.err)
		}
		if !slices.Equal(re.Ranks, []int{3}) || re.Group != "timeout" || re.RunID != "r" || re.Rank != r {
			t.Fatalf("rank %d: error %+v; want it to name group, run, rank %d and missing rank 3", r, re, r)
		}
		if !strings.Contains(x.err.Error(), "rank 3 never joined") {
			t.Fatalf("rank %d: message %q does not say rank 3 never joined", r, x.err)
		}
		if x.took < timeout || x.took > timeout+5*time.Second {
			t.Fatalf("rank %d: Join with a %v timeout returned after %v", r, timeout, x.took)
		}
	}

	// Rank 0 never comes.
	specs := world("timeout", "r2", 3, timeout)[1:]
	res = joinRanks(t, open, specs)
	for _, x := range res {
		if re := asError(t, x.err); !errors.Is(re, rendezvous.ErrTimeout) || !slices.Equal(re.Ranks, []int{0}) ||
			!strings.Contains(re.Error(), "rank 0 creates the group") {
			t.Fatalf("without rank 0: %v; want ErrTimeout naming rank 0", x.err)
		}
	}
}

func TestJoinDuplicateRank(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	specs := world("dup", "r", 3, 30*time.Second)
	specs[2] = specs[1] // rank 1 twice, rank 2 never
	specs = append(specs, rankSpec{opts: specs[1].opts, delay: 200 * time.Millisecond})
	start := time.Now()
	res := joinRanks(t, etcdOpener(t, e, 5*time.Second), specs)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("ranks learned of the duplicate after %v; want it at once, not at the timeout", d)
	}
	for i, x := range res {
		re := asError(t, x.err)
		if !errors.Is(x.err, rendezvous.ErrDuplicateRank) || !slices.Equal(re.Ranks, []int{1}) {
			t.Fatalf("process %d (rank %d): %v; want ErrDuplicateRank naming rank 1", i, specs[i].opts.Rank, x.err)
		}
	}
	t.Logf("duplicate rank error: %v", res[len(res)-1].err)
}

// TestJoinRelaunchAfterKill: a relaunch with the run id of a launch
// killed a moment ago finds that launch's rank keys still on their leases.
// A holder on this host whose process has ended (by its pid, or a pid now
// of a process started at another time) is said to have ended, with the
// hint to start with a new run id, on rank 0 (the group's hold) and on
// the others alike; a holder that runs is said to run.
func TestJoinRelaunchAfterKill(t *testing.T) {
	t.Parallel()
	host, _ := os.Hostname()
	pidNS, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Skipf("skipping: needs /proc: %v", err)
	}
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	record := func(pid int, start string) []byte {
		b, _ := json.Marshal(map[string]any{"world_size": 3, "host": host, "pid": pid, "start": start, "pidns": pidNS})
		return b
	}
	selfStat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(selfStat[bytes.LastIndexByte(selfStat, ')')+1:]))
	myStart := f[19]
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		rank      int
		pid       int
		start     string
		wantWords []string
	}{
		{"receiver, holder exited", 2, exited.Process.Pid, "1", []string{fmt.Sprintf("held by pid %d on this host", exited.Process.Pid), "which has ended", "start this launch with a new run id"}},
		{"receiver, pid reused", 2, os.Getpid(), myStart + "7", []string{"which has ended", "start this launch with a new run id"}},
		{"rank 0, holder exited", 0, exited.Process.Pid, "1", []string{fmt.Sprintf("rank 0 of run \"old\" is still held by pid %d", exited.Process.Pid), "which has ended", "start this launch with a new run id"}},
		{"receiver, holder runs", 2, os.Getpid(), myStart, []string{fmt.Sprintf("held by pid %d on this host", os.Getpid()), "which is running", "give each process its own rank"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := rendezvoustest.NewMem()
			left := m.NewStore()
			defer left.Close()
			if tc.rank == 0 {
				if _, _, err := left.Create(ctx, rendezvous.KeyPrefix+"g/owner", []byte("old")); err != nil {
					t.Fatal(err)
				}
			}
			if _, _, err := left.Create(ctx, fmt.Sprintf("%sg/old/ranks/%d", rendezvous.KeyPrefix, tc.rank), record(tc.pid, tc.start)); err != nil {
				t.Fatal(err)
			}
			_, err := rendezvous.Join(ctx, m.NewStore(), rendezvous.JoinOptions{Group: "g", RunID: "old", Rank: tc.rank, WorldSize: 3, Timeout: 5 * time.Second})
			re := asError(t, err)
			if !errors.Is(err, rendezvous.ErrDuplicateRank) || !slices.Equal(re.Ranks, []int{tc.rank}) {
				t.Fatalf("%v; want ErrDuplicateRank naming rank %d", err, tc.rank)
			}
			for _, w := range tc.wantWords {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\ndoes not say %q", err, w)
				}
			}
			if tc.start != myStart && strings.Contains(err.Error(), "which is running") {
				t.Errorf("an ended holder is said to run: %v", err)
			}
		})
	}
}

func TestJoinWorldSizeMismatch(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	specs := world("ws", "r", 3, 30*time.Second)
	specs[2].opts.WorldSize = 4
	start := time.Now()
	res := joinRanks(t, etcdOpener(t, e, 5*time.Second), specs)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("ranks learned of the mismatch after %v; want it at once", d)
	}
	for r, x := range res {
		re := asError(t, x.err)
		if !errors.Is(x.err, rendezvous.ErrWorldSizeMismatch) || !slices.Equal(re.Ranks, []int{0, 2}) {
			t.Fatalf("rank %d: %v; want ErrWorldSizeMismatch naming ranks 0 and 2", r, x.err)
		}
		if !strings.Contains(x.err.Error(), "world size 4 but rank 0 with 3") {
			t.Fatalf("rank %d: message %q does not give both world sizes", r, x.err)
		}
	}
}

func TestJoinGroupInUse(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	const ttl = 2 * time.Second
	open := etcdOpener(t, e, ttl)

	first := joinRanks(t, open, world("busy", "run-A", 2, 20*time.Second))
	for r, x := range first {
		if x.err != nil {
			t.Fatalf("run A rank %d: %v", r, x.err)
		}
	}
	// Run B's rank 0 waits 3 s (not the default 12 s) for run A's hold to
	// end: A is alive, so the wait ends in ErrGroupInUse either way.
	specsB := world("busy", "run-B", 2, 20*time.Second)
	specsB[0].opts.HeldWait = 3 * time.Second
	second := joinRanks(t, open, specsB)
	for r, x := range second {
		re := asError(t, x.err)
		if !errors.Is(x.err, rendezvous.ErrGroupInUse) || re.Group != "busy" || !strings.Contains(x.err.Error(), `live run "run-A"`) {
			t.Fatalf("run B rank %d: %v; want ErrGroupInUse naming run-A", r, x.err)
		}
	}
	t.Logf("group in use error: %v", second[0].err)

	// Kill run A: its clients go away without revoking their leases.
	crashed := time.Now()
	for _, x := range first {
		rendezvous.Abandon(x.store.(*rendezvous.Etcd))
	}
	watcher := dial(t, []string{e.ClientURL()}, ttl)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := watcher.WaitAbsent(ctx, rendezvous.KeyPrefix+"busy/owner"); err != nil {
		t.Fatalf("run A's owner key did not expire: %v", err)
	}
	expiry := time.Since(crashed)
	t.Logf("owner key expired %v after the crash (TTL %v)", expiry, ttl)
	if expiry > ttl+3*time.Second {
		t.Fatalf("owner key expired %v after the crash; want about the TTL %v", expiry, ttl)
	}
	// Every rank has a lease of its own, kept alive on its own schedule:
	// run A's rank 1 may outlive the owner key (its last keep-alive came
	// later, or etcd expires it in a later sweep), and run B's rank 1
	// revoked its lease in Close only if etcd answered in time. A run
	// with a live rank is not swept (its ranks could still be waiting to
	// join), so wait for every rank key of runs A and B to be gone: from
	// then on, run C's claim must sweep both.
	for _, run := range []string{"run-A", "run-B"} {
		left, err := watcher.List(ctx, rendezvous.KeyPrefix+"busy/"+run+"/ranks/")
		if err != nil {
			t.Fatal(err)
		}
		for k := range left {
			if err := watcher.WaitAbsent(ctx, k); err != nil {
				t.Fatalf("%s's key %q did not expire: %v", run, k, err)
			}
		}
	}
	third := joinRanks(t, open, world("busy", "run-C", 2, 20*time.Second))
	for r, x := range third {
		if x.err != nil {
			t.Fatalf("run C rank %d after run A's lease expired: %v", r, x.err)
		}
	}
	// Run C's rank 0 deleted what runs A and B left behind.
	all, err := watcher.List(ctx, rendezvous.KeyPrefix+"busy/")
	if err != nil {
		t.Fatal(err)
	}
	for k := range all {
		if k != rendezvous.KeyPrefix+"busy/owner" && !strings.HasPrefix(k, rendezvous.KeyPrefix+"busy/run-C/") {
			t.Errorf("key %q of a dead run is left after run C claimed the group", k)
		}
	}
}

func TestPeerGoneAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	const ttl = 2 * time.Second
	res := joinRanks(t, etcdOpener(t, e, ttl), world("gone", "r", 3, 30*time.Second))
	for r, x := range res {
		if x.err != nil {
			t.Fatalf("rank %d: %v", r, x.err)
		}
	}
	// Rank 1 waits for a key rank 2 will never publish.
	getErr := make(chan error, 1)
	go func() {
		_, err := res[1].g.Get(context.Background(), 2, "never")
		getErr <- err
	}()
	time.Sleep(100 * time.Millisecond)
	crashed := time.Now()
	rendezvous.Abandon(res[2].store.(*rendezvous.Etcd))
	for _, r := range []int{0, 1} {
		g := res[r].g
		select {
		case <-g.PeerGone():
		case <-time.After(ttl + 5*time.Second):
			t.Fatalf("rank %d: PeerGone not closed within %v of rank 2's crash", r, ttl+5*time.Second)
		}
		re := asError(t, g.Err())
		if !errors.Is(re, rendezvous.ErrPeerGone) || !errors.Is(re, transport.ErrPeerGone) || !slices.Equal(re.Ranks, []int{2}) {
			t.Fatalf("rank %d: %v; want ErrPeerGone naming rank 2", r, re)
		}
	}
	t.Logf("peer gone %v after the crash: %v", time.Since(crashed), res[0].g.Err())
	select {
	case err := <-getErr:
		if re := asError(t, err); !errors.Is(err, rendezvous.ErrPeerGone) || !slices.Equal(re.Ranks, []int{2}) {
			t.Fatalf("Get from the crashed rank = %v; want ErrPeerGone naming rank 2", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Get from the crashed rank did not end when the group broke")
	}
	if err := res[0].g.Barrier(context.Background(), "b"); !errors.Is(err, rendezvous.ErrPeerGone) {
		t.Fatalf("barrier in a broken group = %v; want ErrPeerGone", err)
	}
}

func TestGroupWaitsTimeOut(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	res := joinRanks(t, etcdOpener(t, e, 5*time.Second), world("waits", "r", 2, time.Second))
	for r, x := range res {
		if x.err != nil {
			t.Fatalf("rank %d: %v", r, x.err)
		}
	}
	ctx := context.Background()
	g0, g1 := res[0].g, res[1].g
	err := g0.Barrier(ctx, "alone")
	if re := asError(t, err); !errors.Is(err, rendezvous.ErrTimeout) || !slices.Equal(re.Ranks, []int{1}) {
		t.Fatalf("barrier without rank 1 = %v; want ErrTimeout naming rank 1", err)
	}
	err = g0.Barrier(ctx, "alone")
	if !errors.Is(err, rendezvous.ErrInvalid) {
		t.Fatalf("barrier name used twice = %v; want ErrInvalid", err)
	}
	_, err = g1.Get(ctx, 0, "unpublished")
	if re := asError(t, err); !errors.Is(err, rendezvous.ErrTimeout) || !slices.Equal(re.Ranks, []int{0}) || !strings.Contains(re.Key, "unpublished") {
		t.Fatalf("get of an unpublished key = %v; want ErrTimeout naming rank 0 and the key", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g1.Get(cctx, 0, "x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("get with a canceled context = %v; want context.Canceled", err)
	}
	if _, err := g1.Get(ctx, 5, "x"); !errors.Is(err, rendezvous.ErrInvalid) {
		t.Fatalf("get from rank 5 of 2 = %v; want ErrInvalid", err)
	}
}

func TestJoinInvalidOptions(t *testing.T) {
	m := rendezvoustest.NewMem()
	ok := rendezvous.JoinOptions{Group: "g", RunID: "r", Rank: 0, WorldSize: 2}
	for name, mod := range map[string]func(*rendezvous.JoinOptions){
		"empty group":    func(o *rendezvous.JoinOptions) { o.Group = "" },
		"slash in group": func(o *rendezvous.JoinOptions) { o.Group = "a/b" },
		"empty run":      func(o *rendezvous.JoinOptions) { o.RunID = "" },
		"run owner":      func(o *rendezvous.JoinOptions) { o.RunID = "owner" },
		"rank too big":   func(o *rendezvous.JoinOptions) { o.Rank = 2 },
		"negative rank":  func(o *rendezvous.JoinOptions) { o.Rank = -1 },
		"world 0":        func(o *rendezvous.JoinOptions) { o.WorldSize = 0 },
		"empty endpoint": func(o *rendezvous.JoinOptions) { o.Endpoints = map[string]string{"": "x"} },
	} {
		o := ok
		mod(&o)
		s := m.NewStore()
		_, err := rendezvous.Join(context.Background(), s, o)
		if !errors.Is(err, rendezvous.ErrInvalid) {
			t.Errorf("%s: Join = %v; want ErrInvalid", name, err)
		}
		if _, _, err := s.Get(context.Background(), "k"); !errors.Is(err, rendezvous.ErrStoreClosed) {
			t.Errorf("%s: the store is still open after Join failed", name)
		}
	}
}

func TestJoinUniqueIDHook(t *testing.T) {
	t.Parallel()
	m := rendezvoustest.NewMem()
	specs := world("hook", "r", 2, 10*time.Second)
	var want [128]byte
	copy(want[:], "nccl unique id")
	specs[0].opts.UniqueID = func() ([128]byte, error) { return want, nil }
	specs[1].opts.UniqueID = func() ([128]byte, error) { panic("only rank 0 makes the unique id") }
	res := joinRanks(t, func() rendezvous.Store { return m.NewStore() }, specs)
	for r, x := range res {
		if x.err != nil || x.g.UniqueID() != want {
			t.Fatalf("rank %d: %v, unique id %q", r, x.err, x.g.UniqueID())
		}
	}

	// A failing hook fails every rank at once, not at the timeout.
	specs = world("hook2", "r", 2, 30*time.Second)
	specs[0].opts.UniqueID = func() ([128]byte, error) { return [128]byte{}, errors.New("no NCCL here") }
	res = joinRanks(t, func() rendezvous.Store { return m.NewStore() }, specs)
	for r, x := range res {
		if x.err == nil || !strings.Contains(x.err.Error(), "no NCCL here") {
			t.Fatalf("rank %d with a failing unique id hook: %v", r, x.err)
		}
	}
	if !errors.Is(res[1].err, rendezvous.ErrAborted) {
		t.Fatalf("rank 1: %v; want ErrAborted", res[1].err)
	}
}

// TestOwnLeaseLost: when a rank's lease is gone (revoked here, as the
// server does when keep-alives stop for a TTL), that rank's Group reports
// itself gone and its store refuses new leased keys, and the other ranks
// see it gone too.
func TestOwnLeaseLost(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	res := joinRanks(t, etcdOpener(t, e, 3*time.Second), world("lost", "r", 2, 10*time.Second))
	for r, x := range res {
		if x.err != nil {
			t.Fatalf("rank %d: %v", r, x.err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s1 := res[1].store.(*rendezvous.Etcd)
	if err := rendezvous.RevokeLease(ctx, s1); err != nil {
		t.Fatal(err)
	}
	for r, x := range res {
		select {
		case <-x.g.PeerGone():
		case <-ctx.Done():
			t.Fatalf("rank %d: PeerGone not closed after rank 1's lease was revoked", r)
		}
		if re := asError(t, x.g.Err()); !errors.Is(re, rendezvous.ErrPeerGone) || !slices.Equal(re.Ranks, []int{1}) {
			t.Fatalf("rank %d: %v; want ErrPeerGone naming rank 1", r, re)
		}
	}
	if !strings.Contains(res[1].g.Err().Error(), "own liveness key") {
		t.Fatalf("rank 1 does not say its own key is gone: %v", res[1].g.Err())
	}
	select {
	case <-rendezvous.LeaseDone(s1):
	case <-ctx.Done():
		t.Fatal("the store did not notice its lease was revoked")
	}
	if _, _, err := s1.CreateLeased(ctx, "/lost/k", nil); !errors.Is(err, rendezvous.ErrLeaseLost) {
		t.Fatalf("create leased after the lease was lost = %v; want ErrLeaseLost", err)
	}
}

// TestJoinNotices has rank 1 of 2 never come: while rank 0 waits, it says
// every NoticeEvery who it waits for and who is there, and how long is
// left, through JoinOptions.Logger.
func TestJoinNotices(t *testing.T) {
	t.Parallel()
	e := startEmbedded(t)
	var logs authtest.LogBuffer
	specs := world("notices", "r", 2, rendezvous.NoticeEvery+1500*time.Millisecond)[:1]
	specs[0].opts.Logger = logs.Logger()
	res := joinRanks(t, etcdOpener(t, e, 5*time.Second), specs)
	if !errors.Is(res[0].err, rendezvous.ErrTimeout) {
		t.Fatalf("Join without rank 1: %v; want ErrTimeout", res[0].err)
	}
	if got := logs.String(); !strings.Contains(got, "rank 0: waiting for rank 1 to join (1 of 2 joined), ") || !strings.Contains(got, "s left") {
		t.Fatalf("rank 0 said %q while it waited; want who it waits for, who joined and the time left", got)
	}
}
