//go:build cgo

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseConfig(t *testing.T) {
	env := map[string]string{"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job"}
	o, err := parseConfig(`{"bucket": "256MiB", "timeout": 1.5, "checksum": false, "device": "cuda:1"}`, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if o.Rank != 2 || o.WorldSize != 4 || o.Rendezvous != "etcd://10.1.2.3:29500" || !o.ServeRendezvous || o.RunID != "job" ||
		o.BucketSize != 256<<20 || o.Timeout != 1500*time.Millisecond || !o.NoChecksum || o.Device != "cuda:1" {
		t.Fatalf("options from torchrun variables: %+v", o)
	}
	o, err = parseConfig(`{"rank": 1, "world_size": 3, "rendezvous": "etcd://h:1", "run_id": "r", "bucket": 4096, "env": {"RANK": "0"}}`, func(string) string { return "" })
	if err != nil || o.Rank != 1 || o.WorldSize != 3 || o.ServeRendezvous || o.BucketSize != 4096 {
		t.Fatalf("explicit options: %+v, %v", o, err)
	}
	o, err = parseConfig(`{"world_size": 3, "rendezvous": "etcd://h:1", "env": {"RANK": "0"}}`, func(string) string { return "7" })
	if err != nil || o.Rank != 0 {
		t.Fatalf("rank from env map: %+v, %v", o, err)
	}
	// A launcher that numbers ranks itself (verl) has rank 0 serve the
	// rendezvous without the torchrun variables; dtype is the rollout cast.
	o, err = parseConfig(`{"rank": 0, "world_size": 2, "rendezvous": "etcd://h:1", "run_id": "r", "serve_rendezvous": true, "dtype": "BF16"}`, func(string) string { return "" })
	if err != nil || !o.ServeRendezvous || o.RolloutDType != dtype.BF16 {
		t.Fatalf("serve_rendezvous and dtype: %+v, %v", o, err)
	}
	if o, err = parseConfig(`{"rank": 1, "world_size": 2, "rendezvous": "etcd://h:1", "run_id": "r", "dtype": "keep"}`, func(string) string { return "" }); err != nil || o.RolloutDType != dtype.Invalid {
		t.Fatalf("dtype keep: %+v, %v", o, err)
	}
	if o, err = parseConfig(`{"rank": 0, "world_size": 2, "rendezvous": "etcd://h:1", "run_id": "r", "bucket_mac": "poly1305-aes"}`, func(string) string { return "" }); err != nil || o.BucketMAC != mac.Poly1305AES {
		t.Fatalf("bucket_mac: %+v, %v", o, err)
	}
	o, err = parseConfig(`{"rank": 0, "world_size": 2, "rendezvous": "etcd://h:1", "quantize": "fp8-block", "quantize_exclude": ["layers\\.0\\."]}`, func(string) string { return "" })
	if err != nil || o.Quantize.Scheme != quant.FP8Block || len(o.Quantize.Exclude) != 1 || o.Quantize.Exclude[0] != `layers\.0\.` {
		t.Fatalf("quantize: %+v, %v", o.Quantize, err)
	}
	for _, c := range []struct{ json, want string }{
		{`{"rank": 0, "world_size": 2, "quantize": "fp4"}`, `unknown quantization scheme "fp4"`},
		{`{"rank": 0, "world_size": 2, "quantize": "fp8-block", "quantize_include": ["("]}`, `include pattern "("`},
		{`{"rank": 0, "world_size": 2, "quantize_include": ["x"]}`, "without a scheme"},
		{`{"rnk": 1}`, `unknown field "rnk"`},
		{`{"serve_rendezvous": true}`, "serve_rendezvous needs rendezvous"},
		{`{"rank": 0, "world_size": 2, "rendezvous": "etcd://h:1", "dtype": "i32"}`, `dtype "i32": choose`},
		{`{"bucket": "lots"}`, `bucket "lots"`},
		{`{"bucket": -4}`, "must be positive"},
		{`{"timeout": 0}`, "timeout 0: give a positive number of seconds"},
		{`{"rank": -3}`, "rank -3 is negative"},
		{`not json`, "configuration not json"},
		{`[1]`, "configuration [1]"},
		{`{"rank": 0, "world_size": 2, "bucket": 100}`, "bucket 100 is below the minimum of 1.0 KiB"},
		{`{"rank": 0, "world_size": 2, "group": "a/b"}`, `group "a/b": a group name must be`},
		{`{"rank": 0, "world_size": 2, "bucket_mac": "md5"}`, `bucket_mac "md5": choose "blake3" or "poly1305-aes"`},
		{`{}`, "RANK is not set"},
	} {
		_, err := parseConfig(c.json, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), c.want) || codeOf(err) != -2 {
			t.Errorf("%s: %v (code %d), want %q", c.json, err, codeOf(err), c.want)
		}
	}
}

func TestCallRecoversPanics(t *testing.T) {
	var text string
	set := func(s, _ string) { text = s }
	if code := call(set, func() (int, error) { panic("boom") }); code != wcErrPanic || !strings.Contains(text, "panic: boom") || !strings.Contains(text, "capi_test.go") {
		t.Fatalf("panic: code %d, text %q", code, text)
	}
	var nilMap map[string]int
	if code := call(set, func() (int, error) { nilMap["x"] = 1; return 0, nil }); code != wcErrPanic || !strings.Contains(text, "nil map") {
		t.Fatalf("runtime error: code %d, text %q", code, text)
	}
	if code := call(set, func() (int, error) { return wcAgain, nil }); code != wcAgain {
		t.Fatalf("status passed through as %d", code)
	}
	if code := call(set, func() (int, error) { return wcOK, errors.New("plain") }); code != wcErrOther || text != "plain" {
		t.Fatalf("plain error: %d %q", code, text)
	}
	if code := call(set, func() (int, error) { return wcOK, fmt.Errorf("x: %w", weightcast.ErrConfig) }); code != -2 {
		t.Fatalf("config error: %d", code)
	}
}

func TestUnknownAndClosedHandles(t *testing.T) {
	for _, h := range []int64{0, -1, 1 << 40} {
		if _, err := lookup[*senderHandle](h); codeOf(err) != -6 {
			t.Errorf("handle %d: %v", h, err)
		}
		if err := closeHandle(h); err != nil {
			t.Errorf("closing unknown handle %d: %v", h, err)
		}
		if err := abort(h, "x"); codeOf(err) != -6 {
			t.Errorf("abort of unknown handle %d: %v", h, err)
		}
		if _, err := info(h); codeOf(err) != -6 {
			t.Errorf("info of unknown handle %d: %v", h, err)
		}
	}
}

// openPair opens a sender and a receiver over inproc through the C
// library's own open calls.
func openPair(t *testing.T, group string) (*senderHandle, *receiverHandle, int64, int64) {
	t.Helper()
	cfg := func(rank int) string {
		return fmt.Sprintf(`{"group": %q, "rank": %d, "world_size": 2, "transport": "inproc", "bucket": 4096, "timeout": 20}`, group, rank)
	}
	var hs, hr int64
	var es, er error
	var wg sync.WaitGroup
	wg.Go(func() { hs, es = openSender(cfg(0)) })
	wg.Go(func() { hr, er = openReceiver(cfg(1)) })
	wg.Wait()
	if err := errors.Join(es, er); err != nil {
		t.Fatal(err)
	}
	s, err := lookup[*senderHandle](hs)
	if err != nil {
		t.Fatal(err)
	}
	r, err := lookup[*receiverHandle](hr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lookup[*senderHandle](hr); codeOf(err) != -2 || !strings.Contains(err.Error(), "is a receiver") {
		t.Fatalf("receiver handle used as a sender: %v", err)
	}
	return s, r, hs, hr
}

// TestRoundThroughHandles sends tensors, some split across buckets, and
// takes them batch by batch as the C library describes them in C memory.
func TestRoundThroughHandles(t *testing.T) {
	s, r, hs, hr := openPair(t, "capi-round")
	want := map[string][]byte{}
	var refs []weightcast.Ref
	for i, n := range []int{0, 8, 1000, 4096, 9000, 12} {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		name := fmt.Sprintf("t%d", i)
		want[name] = b
		refs = append(refs, weightcast.Ref{Name: name, DType: "U8", Shape: []int64{int64(n)}, Data: b})
	}
	if _, err := s.wait(0); codeOf(err) != -2 {
		t.Fatalf("wait with no round: %v", err)
	}
	if err := s.send(1, refs); err != nil {
		t.Fatal(err)
	}
	if err := s.send(2, refs); codeOf(err) != -2 {
		t.Fatalf("second send while one runs: %v", err)
	}
	if err := r.receive(); err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		code, b, err := r.next(0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if code == wcDone {
			break
		}
		if code != wcOK {
			continue
		}
		ts := unsafe.Slice(b.b.tensors, int(b.b.n))
		names := unsafe.Slice((*byte)(unsafe.Pointer(b.b.names)), max(int(b.b.names_len), 1))
		dims := unsafe.Slice(b.b.dims, max(int(b.b.ndims), 1))
		for i := range ts {
			tn := &ts[i]
			name := string(names[tn.name : tn.name+tn.name_len])
			if tn.ndim != 1 || int64(dims[tn.dims]) != int64(tn.nbytes) || tn.device != -1 {
				t.Fatalf("%s: ndim %d, dims[0] %d, nbytes %d, device %d", name, tn.ndim, dims[tn.dims], tn.nbytes, tn.device)
			}
			var data []byte
			if tn.nbytes > 0 {
				data = bytes.Clone(hostBytes(tn.data, tn.nbytes))
			}
			got[name] = data
		}
	}
	for code := wcAgain; code == wcAgain; {
		var err error
		if code, err = s.wait(100); err != nil {
			t.Fatal(err)
		}
	}
	for name, w := range want {
		if !bytes.Equal(got[name], w) {
			t.Fatalf("%s differs", name)
		}
	}
	text, err := info(hr)
	if err != nil || !strings.Contains(text, `"transport":"inproc"`) || !strings.Contains(text, `"role":"receiver"`) {
		t.Fatalf("info: %s, %v", text, err)
	}
	if s.s.Committed() != 1 || r.r.Committed() != 1 || r.r.State() != stages.StateIntact {
		t.Fatalf("committed %d and %d", s.s.Committed(), r.r.Committed())
	}
	if err := errors.Join(closeHandle(hr), closeHandle(hs), closeHandle(hs)); err != nil {
		t.Fatal(err)
	}
	if _, err := lookup[*senderHandle](hs); codeOf(err) != -6 {
		t.Fatalf("closed handle: %v", err)
	}
}

// TestCloseDuringRound closes both handles while a round waits: the
// round ends, its goroutine is joined (goleak checks), nothing hangs.
func TestCloseDuringRound(t *testing.T) {
	_, r, hs, hr := openPair(t, "capi-close")
	if err := r.receive(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- errors.Join(closeHandle(hr), closeHandle(hs)) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("closing during a round hung")
	}
}

func TestConfigSecurity(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/secret"
	if err := os.WriteFile(path, []byte("a-group-secret-of-some-length\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseConfig(`{"rank": 1, "world_size": 2, "rendezvous": "etcd://h:1", "env": {"WEIGHTCAST_SECRET_FILE": "`+path+`"}, "tls_ca": "ca.pem", "tls_cert": "c.pem", "tls_key": "k.pem"}`, func(string) string { return "" })
	if err != nil || o.Secret == nil || o.TLS.CA != "ca.pem" || o.TLS.Cert != "c.pem" || o.TLS.Key != "k.pem" {
		t.Fatalf("secret from the env map, TLS files: %+v, %v", o, err)
	}
	// Readable or writable by anyone but its owner: refused through the
	// one check of auth.ReadSecretFile, as a configuration error.
	for _, mode := range []os.FileMode{0o644, 0o660, 0o640} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := parseConfig(`{"rank": 1, "world_size": 2, "rendezvous": "etcd://h:1", "secret_file": "`+path+`"}`, func(string) string { return "" })
		var me *auth.SecretModeError
		if codeOf(err) != -2 || !strings.Contains(err.Error(), "secret_file") || !errors.As(err, &me) || me.Mode != mode {
			t.Fatalf("a secret file of mode %#o: %v; want a configuration error with auth.SecretModeError", mode, err)
		}
	}
}

// TestReceiveIntoThroughHandles receives a round straight into host
// tensors handed in by address (wc_receive_into, then wc_wait on the
// receiver's handle); wc_next refuses an into-round and wc_wait a round
// wc_receive started (nobody would take its batches).
func TestReceiveIntoThroughHandles(t *testing.T) {
	s, r, hs, hr := openPair(t, "capi-into")
	defer func() { closeHandle(hr); closeHandle(hs) }()
	var src, dst []weightcast.Ref
	for i, n := range []int{0, 8, 5000, 12} {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(i*17 + j)
		}
		name := fmt.Sprintf("t%d", i)
		src = append(src, weightcast.Ref{Name: name, DType: "U8", Shape: []int64{int64(n)}, Data: b})
		dst = append(dst, weightcast.Ref{Name: name, DType: "U8", Shape: []int64{int64(n)}, Data: make([]byte, n)})
	}
	if err := r.receiveInto(dst); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.next(0, 10); codeOf(err) != -2 || !strings.Contains(err.Error(), "wc_wait") {
		t.Fatalf("wc_next during a wc_receive_into round: %v", err)
	}
	if err := s.send(1, src); err != nil {
		t.Fatal(err)
	}
	waitOK := func(what string, wait func(int32) (int, error)) {
		t.Helper()
		for code := wcAgain; code == wcAgain; {
			var err error
			if code, err = wait(100); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	waitOK("receiver", r.waitInto)
	waitOK("sender", s.wait)
	for i := range src {
		if !bytes.Equal(dst[i].Data, src[i].Data) {
			t.Fatalf("%s differs", src[i].Name)
		}
	}
	if err := r.receive(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.waitInto(10); codeOf(err) != -2 || !strings.Contains(err.Error(), "wc_next") {
		t.Fatalf("wc_wait during a wc_receive round: %v", err)
	}
}

// TestConfigRoundTrip: Options encoded as JSON decode, through the C
// library's parseConfig, to the same Options; a decoded default fills in
// as Validate says; the error of a field carries its detail for Python.
func TestConfigRoundTrip(t *testing.T) {
	path := t.TempDir() + "/secret"
	if err := os.WriteFile(path, []byte("a-group-secret-of-some-length\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := weightcast.Options{
		Group: "g", Rank: 1, WorldSize: 3, Rendezvous: "etcd://h:1", ServeRendezvous: true, RunID: "r",
		Transport: "tcp", BucketSize: 64 << 10, Timeout: 1500 * time.Millisecond, NoChecksum: true, NoDirect: true, NoTurns: true,
		RolloutDType: dtype.BF16, Quantize: stages.QuantizeConfig{Scheme: quant.FP8Block, Include: []string{"a"}, Exclude: []string{"b"}},
		Device: "cuda:1", Advertise: "10.0.0.2", SecretFile: path,
		TLS: auth.TLSFiles{CA: "ca.pem", Cert: "c.pem", Key: "k.pem"},
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := parseConfig(string(b), func(string) string { return "" })
	if err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if out.Secret == nil {
		t.Fatalf("%s: no secret read from secret_file", b)
	}
	out.Secret, out.HostMemory = nil, nil
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip through %s:\n got %+v\nwant %+v", b, out, in)
	}
	// The keys Python sends today, with the defaults left to Go.
	o, err := parseConfig(`{"rank": 0, "world_size": 2, "rendezvous": "etcd://h:1", "run_id": "r", "checksum": true, "bucket": "1GiB"}`, func(string) string { return "" })
	if err != nil || o.BucketSize != weightcast.DefaultBucketSize || o.Timeout != weightcast.DefaultTimeout || o.Group != weightcast.DefaultGroup || o.NoChecksum {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
	_, err = parseConfig(`{"rank": 0, "world_size": 2, "rendezvous": "etcd://h:1", "bucket": 100}`, func(string) string { return "" })
	var d map[string]string
	if detail := fieldDetail(err); json.Unmarshal([]byte(detail), &d) != nil || d["field"] != "bucket" || d["value"] != "100" ||
		d["prefix"]+d["field"]+" "+d["value"]+d["problem"] != err.Error() {
		t.Fatalf("field detail of %v: %s", err, detail)
	}
	if detail := fieldDetail(errors.New("plain")); detail != "" {
		t.Fatalf("field detail of a plain error: %s", detail)
	}
}

// TestRoundThroughViews takes a round as wc_next_views describes it:
// every tensor's bytes found in its region at its offset, the tensors of
// the bucket in one region, a tensor split across buckets in a region of
// its own, an empty tensor in none.
func TestRoundThroughViews(t *testing.T) {
	s, r, hs, hr := openPair(t, "capi-views")
	want := map[string][]byte{}
	var refs []weightcast.Ref
	for i, n := range []int{0, 8, 1000, 4096, 9000, 12, 64} {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(i*37 + j)
		}
		name := fmt.Sprintf("v%d", i)
		want[name] = b
		refs = append(refs, weightcast.Ref{Name: name, DType: "U8", Shape: []int64{int64(n)}, Data: b})
	}
	if err := s.send(1, refs); err != nil {
		t.Fatal(err)
	}
	if err := r.receive(); err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	regionsOf := map[string]int{} // name -> regions in its batch
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		code, out, err := r.nextAs(0, 100, func(b *sink.Batch) cMemory { return newCViews(b) })
		if err != nil {
			t.Fatal(err)
		}
		if code == wcDone {
			break
		}
		if code != wcOK {
			continue
		}
		v := out.(*cViews).v
		vs := unsafe.Slice(v.views, int(v.n))
		rs := unsafe.Slice(v.regions, max(int(v.nregions), 1))
		names := unsafe.Slice((*byte)(unsafe.Pointer(v.names)), max(int(v.names_len), 1))
		dims := unsafe.Slice(v.dims, max(int(v.ndims), 1))
		if v.version != 1 {
			t.Fatalf("version %d", v.version)
		}
		for i := range vs {
			tv := &vs[i]
			name := string(names[tv.name : tv.name+tv.name_len])
			dt := string(bytes.TrimRight(unsafe.Slice((*byte)(unsafe.Pointer(&tv.dtype[0])), len(tv.dtype)), "\x00"))
			if tv.ndim != 1 || int64(dims[tv.dims]) != int64(tv.nbytes) || dt != "U8" {
				t.Fatalf("%s: ndim %d, dims[0] %d, nbytes %d, dtype %q", name, tv.ndim, dims[tv.dims], tv.nbytes, dt)
			}
			if tv.nbytes == 0 {
				if tv.region != -1 {
					t.Fatalf("%s: no bytes, in region %d", name, tv.region)
				}
				got[name] = nil
				continue
			}
			if tv.region < 0 || tv.region >= v.nregions {
				t.Fatalf("%s: region %d of %d", name, tv.region, v.nregions)
			}
			rg := rs[tv.region]
			if rg.device != -1 || uint64(tv.offset)+uint64(tv.nbytes) > uint64(rg.len) {
				t.Fatalf("%s: [%d, +%d) in region of %d bytes on device %d", name, tv.offset, tv.nbytes, rg.len, rg.device)
			}
			got[name] = bytes.Clone(hostBytes(rg.base+tv.offset, tv.nbytes))
			regionsOf[name] = int(v.nregions)
		}
	}
	for code := wcAgain; code == wcAgain; {
		var err error
		if code, err = s.wait(100); err != nil {
			t.Fatal(err)
		}
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || !bytes.Equal(g, w) {
			t.Fatalf("%s differs (received: %v)", name, ok)
		}
	}
	// 9000 bytes do not fit a 4096-byte bucket: assembled, in a region of
	// its own beside its last bucket's.
	if regionsOf["v4"] < 2 {
		t.Fatalf("the split tensor's batch has %d regions", regionsOf["v4"])
	}
	if err := errors.Join(closeHandle(hr), closeHandle(hs)); err != nil {
		t.Fatal(err)
	}
}
