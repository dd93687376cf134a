package rendezvoustest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/rendezvous"
)

// TestStore runs the conformance suite on a Store implementation. open
// returns a new store connected to the same backend on every call, each
// with its own lease, as separate processes would have; it should
// register the store's Close with t.Cleanup (Close is idempotent, so the
// suite may close stores itself too). Every subtest uses its own key
// prefix, so one backend can serve the whole suite.
func TestStore(t *testing.T, open func(t *testing.T) rendezvous.Store) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, open func(t *testing.T) rendezvous.Store, prefix string)
	}{
		{"CreateIfAbsent", testCreateIfAbsent},
		{"CreateLeasedIfAbsent", testCreateLeasedIfAbsent},
		{"GetAbsent", testGetAbsent},
		{"EmptyValue", testEmptyValue},
		{"ValuesAreCopies", testValuesAreCopies},
		{"WaitExisting", testWaitExisting},
		{"WaitBlocksUntilCreated", testWaitBlocksUntilCreated},
		{"WaitDeadline", testWaitDeadline},
		{"WaitCancel", testWaitCancel},
		{"WaitAbsent", testWaitAbsent},
		{"LeasedKeysGoWithOwner", testLeasedKeysGoWithOwner},
		{"WaitChange", testWaitChange},
		{"Lease", testLease},
		{"DeleteIf", testDeleteIf},
		{"Add", testAdd},
		{"AddConcurrent", testAddConcurrent},
		{"AddNotACounter", testAddNotACounter},
		{"List", testList},
		{"DeletePrefix", testDeletePrefix},
		{"Close", testClose},
		{"CloseEndsWait", testCloseEndsWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := fmt.Sprintf("/conformance/%s/%s/", rand.Text(), tc.name)
			tc.fn(t, open, prefix)
		})
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustCreate(t *testing.T, ctx context.Context, s rendezvous.Store, key, val string, leased bool) {
	t.Helper()
	create := s.Create
	if leased {
		create = s.CreateLeased
	}
	created, existing, err := create(ctx, key, []byte(val))
	if err != nil {
		t.Fatalf("create %q: %v", key, err)
	}
	if !created {
		t.Fatalf("create %q: key exists already with %q", key, existing)
	}
}

func mustGet(t *testing.T, ctx context.Context, s rendezvous.Store, key string) (string, bool) {
	t.Helper()
	v, ok, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return string(v), ok
}

func testCreateIfAbsent(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	mustCreate(t, ctx, a, p+"k", "first", false)
	for _, s := range []rendezvous.Store{a, b} {
		for _, create := range []func(context.Context, string, []byte) (bool, []byte, error){s.Create, s.CreateLeased} {
			created, existing, err := create(ctx, p+"k", []byte("second"))
			if err != nil || created || string(existing) != "first" {
				t.Fatalf("second create = %v, %q, %v; want false, \"first\", nil", created, existing, err)
			}
		}
	}
	if v, ok := mustGet(t, ctx, b, p+"k"); !ok || v != "first" {
		t.Fatalf("get = %q, %v; want \"first\", true", v, ok)
	}
}

func testCreateLeasedIfAbsent(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	mustCreate(t, ctx, a, p+"k", "mine", true)
	created, existing, err := b.CreateLeased(ctx, p+"k", []byte("yours"))
	if err != nil || created || string(existing) != "mine" {
		t.Fatalf("second create = %v, %q, %v; want false, \"mine\", nil", created, existing, err)
	}
	// Many leased keys share the one lease.
	mustCreate(t, ctx, a, p+"k2", "also mine", true)
	if v, ok := mustGet(t, ctx, b, p+"k2"); !ok || v != "also mine" {
		t.Fatalf("get = %q, %v", v, ok)
	}
}

func testGetAbsent(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	v, ok, err := open(t).Get(ctx, p+"nothing")
	if err != nil || ok || v != nil {
		t.Fatalf("get of absent key = %q, %v, %v; want nil, false, nil", v, ok, err)
	}
}

func testEmptyValue(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	s := open(t)
	mustCreate(t, ctx, s, p+"empty", "", false)
	if v, ok := mustGet(t, ctx, s, p+"empty"); !ok || v != "" {
		t.Fatalf("get = %q, %v; want \"\", true", v, ok)
	}
	if v, err := s.Wait(ctx, p+"empty"); err != nil || len(v) != 0 {
		t.Fatalf("wait = %q, %v; want empty, nil", v, err)
	}
	created, existing, err := s.Create(ctx, p+"empty", []byte("x"))
	if err != nil || created || len(existing) != 0 {
		t.Fatalf("create over empty value = %v, %q, %v; want false, empty, nil", created, existing, err)
	}
}

func testValuesAreCopies(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	s := open(t)
	in := []byte("abc")
	mustCreate(t, ctx, s, p+"k", string(in), false)
	if _, _, err := s.Create(ctx, p+"k2", in); err != nil {
		t.Fatal(err)
	}
	in[0] = 'X'
	out, _, err := s.Get(ctx, p+"k2")
	if err != nil || string(out) != "abc" {
		t.Fatalf("get after changing the caller's slice = %q, %v; want \"abc\"", out, err)
	}
	out[0] = 'Y'
	if v, _ := mustGet(t, ctx, s, p+"k2"); v != "abc" {
		t.Fatalf("get after changing a returned slice = %q; want \"abc\"", v)
	}
}

func testWaitExisting(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	mustCreate(t, ctx, a, p+"k", "v", true)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, err := b.Wait(wctx, p+"k")
	if err != nil || string(v) != "v" {
		t.Fatalf("wait for existing key = %q, %v; want \"v\", nil", v, err)
	}
}

func testWaitBlocksUntilCreated(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	type result struct {
		v   []byte
		err error
	}
	got := make(chan result, 1)
	go func() {
		v, err := b.Wait(ctx, p+"k")
		got <- result{v, err}
	}()
	// Other keys, even with a common prefix, do not wake it for good.
	mustCreate(t, ctx, a, p+"k-other", "no", false)
	mustCreate(t, ctx, a, p+"k/child", "no", false)
	select {
	case r := <-got:
		t.Fatalf("wait returned %q, %v before the key existed", r.v, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	mustCreate(t, ctx, a, p+"k", "hello", true)
	select {
	case r := <-got:
		if r.err != nil || string(r.v) != "hello" {
			t.Fatalf("wait = %q, %v; want \"hello\", nil", r.v, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return within 5s of the key being created")
	}
}

func testWaitDeadline(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Wait(ctx, p+"never")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait past its deadline = %v; want an error wrapping context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 5*time.Second {
		t.Fatalf("wait with a 300ms deadline returned after %v", d)
	}
	if !strings.Contains(err.Error(), p+"never") {
		t.Fatalf("error %q does not name the key", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	mustCreate(t, ctxFor(t), s, p+"present", "x", false)
	if err := s.WaitAbsent(ctx2, p+"present"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait-absent past its deadline = %v; want an error wrapping context.DeadlineExceeded", err)
	}
}

func testWaitCancel(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	s := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx, p+"never")
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled wait = %v; want an error wrapping context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return within 5s of its context being canceled")
	}
}

func testWaitAbsent(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	if err := b.WaitAbsent(ctx, p+"absent"); err != nil {
		t.Fatalf("wait-absent on an absent key: %v", err)
	}
	mustCreate(t, ctx, a, p+"dir/k", "v", false)
	errc := make(chan error, 1)
	go func() { errc <- b.WaitAbsent(ctx, p+"dir/k") }()
	mustCreate(t, ctx, a, p+"dir/k2", "v", false) // another key's change
	select {
	case err := <-errc:
		t.Fatalf("wait-absent returned %v while the key existed", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := a.DeletePrefix(ctx, p+"dir/"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("wait-absent: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait-absent did not return within 5s of the key's deletion")
	}
}

// waitChange runs WaitChange in the background; the returned function
// waits (5 s at most) for its result.
func waitChange(t *testing.T, ctx context.Context, s rendezvous.Store, key, value string) func() (rendezvous.Change, string) {
	type result struct {
		c   rendezvous.Change
		v   []byte
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, v, err := s.WaitChange(ctx, key, []byte(value))
		res <- result{c, v, err}
	}()
	return func() (rendezvous.Change, string) {
		t.Helper()
		select {
		case r := <-res:
			if r.err != nil {
				t.Fatalf("wait for a change of %s: %v", key, r.err)
			}
			return r.c, string(r.v)
		case <-time.After(5 * time.Second):
			t.Fatalf("wait for a change of %s did not return within 5s", key)
			return 0, ""
		}
	}
}

func testWaitChange(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	if c, _, err := b.WaitChange(ctx, p+"absent", nil); err != nil || c != rendezvous.Deleted {
		t.Fatalf("wait for a change of an absent key = %v, %v; want Deleted at once", c, err)
	}
	mustCreate(t, ctx, a, p+"k", "v1", true)
	if c, v, err := b.WaitChange(ctx, p+"k", []byte("other")); err != nil || c != rendezvous.Rewritten || string(v) != "v1" {
		t.Fatalf("wait for a change from a value the key does not hold = %v %q, %v; want Rewritten \"v1\" at once", c, v, err)
	}
	got := waitChange(t, ctx, b, p+"k", "v1")
	mustCreate(t, ctx, a, p+"k-other", "v", true) // another key's change
	time.Sleep(100 * time.Millisecond)
	if ok, err := b.DeleteIf(ctx, p+"k", []byte("v1")); !ok || err != nil {
		t.Fatalf("delete-if of the right value = %v, %v", ok, err)
	}
	if c, _ := got(); c != rendezvous.Deleted {
		t.Fatalf("a deleted key: %v; want Deleted", c)
	}
	// An unleased key deleted by prefix: Deleted.
	mustCreate(t, ctx, a, p+"dir/u", "u", false)
	got = waitChange(t, ctx, b, p+"dir/u", "u")
	time.Sleep(100 * time.Millisecond)
	if err := a.DeletePrefix(ctx, p+"dir/"); err != nil {
		t.Fatal(err)
	}
	if c, _ := got(); c != rendezvous.Deleted {
		t.Fatalf("an unleased key deleted by prefix: %v; want Deleted", c)
	}
	// A wait that sees nothing ends with its context.
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, _, err := b.WaitChange(dctx, p+"k-other", []byte("v")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait for a change that never comes = %v; want the context's deadline", err)
	}
}

func testLease(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	mustCreate(t, ctx, a, p+"leased", "v", true)
	ida, err := a.Lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := a.Lease(ctx); err != nil || again != ida {
		t.Fatalf("a second Lease = %x, %v; want the same lease %x", again, err, ida)
	}
	idb, err := b.Lease(ctx)
	if err != nil || idb == ida {
		t.Fatalf("another store's lease = %x, %v; want its own", idb, err)
	}
	if alive, err := b.LeaseAlive(ctx, ida); err != nil || !alive {
		t.Fatalf("a live store's lease alive = %v, %v", alive, err)
	}
	got := waitChange(t, ctx, b, p+"leased", "v")
	time.Sleep(100 * time.Millisecond)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if c, _ := got(); c != rendezvous.Deleted {
		t.Fatalf("a leased key whose owner closed its store: %v; want Deleted", c)
	}
	if alive, err := b.LeaseAlive(ctx, ida); err != nil || alive {
		t.Fatalf("a closed store's lease alive = %v, %v", alive, err)
	}
	if alive, err := b.LeaseAlive(ctx, 0x7eadbeef); err != nil || alive {
		t.Fatalf("a lease that never was alive = %v, %v", alive, err)
	}
}

func testDeleteIf(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	if ok, err := b.DeleteIf(ctx, p+"absent", nil); ok || err != nil {
		t.Fatalf("delete-if of an absent key = %v, %v", ok, err)
	}
	if ok, err := b.DeleteIf(ctx, p+"absent", []byte("")); ok || err != nil {
		t.Fatalf("delete-if of an absent key with an empty value = %v, %v", ok, err)
	}
	mustCreate(t, ctx, a, p+"k", "v", true)
	mustCreate(t, ctx, a, p+"k2", "v", false)
	if ok, err := b.DeleteIf(ctx, p+"k", []byte("w")); ok || err != nil {
		t.Fatalf("delete-if of another value = %v, %v", ok, err)
	}
	if _, ok := mustGet(t, ctx, b, p+"k"); !ok {
		t.Fatal("delete-if of another value deleted the key")
	}
	if ok, err := b.DeleteIf(ctx, p+"k", []byte("v")); !ok || err != nil {
		t.Fatalf("delete-if of the value = %v, %v", ok, err)
	}
	if _, ok := mustGet(t, ctx, b, p+"k"); ok {
		t.Fatal("delete-if of the value left the key")
	}
	if _, ok := mustGet(t, ctx, b, p+"k2"); !ok {
		t.Fatal("delete-if deleted another key")
	}
}

func testLeasedKeysGoWithOwner(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	mustCreate(t, ctx, a, p+"leased", "v", true)
	mustCreate(t, ctx, a, p+"leased2", "v", true)
	mustCreate(t, ctx, a, p+"kept", "v", false)
	mustCreate(t, ctx, b, p+"other-owner", "v", true)
	errc := make(chan error, 1)
	go func() { errc <- b.WaitAbsent(ctx, p+"leased") }()
	time.Sleep(50 * time.Millisecond)
	if err := a.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("wait-absent: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a leased key was not deleted within 5s of its owner's Close")
	}
	for key, want := range map[string]bool{"leased": false, "leased2": false, "kept": true, "other-owner": true} {
		if _, ok := mustGet(t, ctx, b, p+key); ok != want {
			t.Errorf("after the owner closed, key %q exists = %v; want %v", key, ok, want)
		}
	}
}

func testAdd(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	s := open(t)
	for i, step := range []struct{ delta, want int64 }{{1, 1}, {1, 2}, {5, 7}, {-3, 4}} {
		got, err := s.Add(ctx, p+"n", step.delta)
		if err != nil || got != step.want {
			t.Fatalf("add #%d (%+d) = %d, %v; want %d", i, step.delta, got, err, step.want)
		}
	}
	if v, _ := mustGet(t, ctx, s, p+"n"); v != "4" {
		t.Fatalf("counter reads %q; want \"4\"", v)
	}
}

func testAddConcurrent(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	const stores, adds = 4, 10
	var (
		mu   sync.Mutex
		seen []int64
		wg   sync.WaitGroup
	)
	errs := make(chan error, stores)
	for range stores {
		s := open(t)
		wg.Go(func() {
			for range adds {
				n, err := s.Add(ctx, p+"n", 1)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				seen = append(seen, n)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent add: %v", err)
	}
	slices.Sort(seen)
	for i, n := range seen {
		if n != int64(i+1) {
			t.Fatalf("concurrent adds returned %v; want each of 1..%d once", seen, stores*adds)
		}
	}
}

func testAddNotACounter(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	s := open(t)
	mustCreate(t, ctx, s, p+"word", "hello", false)
	if _, err := s.Add(ctx, p+"word", 1); err == nil {
		t.Fatal("add to a non-numeric value succeeded")
	}
}

func testList(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	want := map[string][]byte{p + "dir/a": []byte("1"), p + "dir/b": []byte("2"), p + "dir/c/d": []byte("3")}
	for k, v := range want {
		mustCreate(t, ctx, a, k, string(v), k == p+"dir/b")
	}
	mustCreate(t, ctx, a, p+"dirx", "no", false)
	mustCreate(t, ctx, a, p+"other/a", "no", false)
	got, err := b.List(ctx, p+"dir/")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("list = %q; want %q", got, want)
	}
	for k, v := range want {
		if !bytes.Equal(got[k], v) {
			t.Fatalf("list = %q; want %q", got, want)
		}
	}
	if got, err := b.List(ctx, p+"nothing/"); err != nil || len(got) != 0 {
		t.Fatalf("list of an empty prefix = %q, %v", got, err)
	}
}

func testDeletePrefix(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	a, b := open(t), open(t)
	mustCreate(t, ctx, a, p+"run/a", "1", true)
	mustCreate(t, ctx, a, p+"run/b/c", "2", false)
	mustCreate(t, ctx, a, p+"runner", "3", false)
	if _, err := a.Add(ctx, p+"run/n", 1); err != nil {
		t.Fatal(err)
	}
	if err := b.DeletePrefix(ctx, p+"run/"); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.List(ctx, p+"run/"); len(got) != 0 {
		t.Fatalf("after delete, prefix holds %q", got)
	}
	if _, ok := mustGet(t, ctx, b, p+"runner"); !ok {
		t.Fatal("delete of prefix run/ deleted key runner")
	}
	if err := b.DeletePrefix(ctx, ""); err == nil {
		t.Fatal("delete of the empty prefix (every key) was not refused")
	}
	if _, ok := mustGet(t, ctx, b, p+"runner"); !ok {
		t.Fatal("a refused delete of every key deleted keys")
	}
}

func testClose(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	s := open(t)
	mustCreate(t, ctx, s, p+"k", "v", true)
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	checks := map[string]error{}
	_, _, checks["create"] = s.Create(ctx, p+"k2", nil)
	_, _, checks["create leased"] = s.CreateLeased(ctx, p+"k3", nil)
	_, _, checks["get"] = s.Get(ctx, p+"k")
	_, checks["list"] = s.List(ctx, p)
	_, checks["wait"] = s.Wait(ctx, p+"k")
	checks["wait absent"] = s.WaitAbsent(ctx, p+"k")
	_, _, checks["wait change"] = s.WaitChange(ctx, p+"k", []byte("v"))
	_, checks["delete if"] = s.DeleteIf(ctx, p+"k", []byte("v"))
	_, checks["lease"] = s.Lease(ctx)
	_, checks["lease alive"] = s.LeaseAlive(ctx, 1)
	_, checks["add"] = s.Add(ctx, p+"n", 1)
	checks["delete prefix"] = s.DeletePrefix(ctx, p)
	for op, err := range checks {
		if !errors.Is(err, rendezvous.ErrStoreClosed) {
			t.Errorf("%s after close = %v; want an error wrapping ErrStoreClosed", op, err)
		}
	}
}

func testCloseEndsWait(t *testing.T, open func(*testing.T) rendezvous.Store, p string) {
	ctx := ctxFor(t)
	s := open(t)
	errc := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx, p+"never")
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	s.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, rendezvous.ErrStoreClosed) {
			t.Fatalf("wait ended by close = %v; want an error wrapping ErrStoreClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return within 5s of its store's Close")
	}
}
