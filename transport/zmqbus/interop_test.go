package zmqbus

// Interoperability with libzmq: testdata/*.py implement the protocol from
// docs/protocol.md on pyzmq. The tests skip where no Python with pyzmq is
// installed (Debian: apt-get install python3-zmq).

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// pythonWithZMQ returns a Python interpreter that can import zmq.
func pythonWithZMQ(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import zmq").Run() == nil {
			return py
		}
	}
	t.Skip("no python3 with pyzmq (Debian: apt-get install python3-zmq)")
	return ""
}

// startPython runs testdata/script with args as a Python peer. If the
// test fails, its stderr is logged.
func startPython(t *testing.T, script string, args ...string) *lineProc {
	t.Helper()
	cmd := exec.Command(pythonWithZMQ(t), append([]string{script}, args...)...)
	cmd.Dir = "testdata"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t.Cleanup(func() { // runs after startLines's cleanup has reaped the process
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("%s stderr:\n%s", script, stderr.String())
		}
	})
	return startLines(t, "python peer", cmd)
}

// TestInteropPythonReceiver: a libzmq receiver joins a Go root next to a
// Go receiver and gets every message intact and in order, then BYE.
func TestInteropPythonReceiver(t *testing.T) {
	ctx := testContext(t, time.Minute)
	const world, n = 3, 60
	cfgs := configs(t, world, 20*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	py := startPython(t, "pyreceiver.py", rootAddr(t, ctx, cfgs[1]), "2", strconv.Itoa(world), cfgs[0].Group)
	sub := openSubscriber(t, ctx, cfgs[1])
	if l, want := py.line(t), fmt.Sprintf("welcome %d 1000 3000", transport.DefaultWindow); l != want {
		t.Fatalf("python receiver said %q, want %q", l, want)
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = consume(ctx, sub, 1, n) })
	wg.Go(func() { errs[1] = produce(ctx, pub, n) })
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for k := range n {
		sum := sha256.Sum256(payload(k))
		want := fmt.Sprintf("data %d %d %s", k, len(payload(k)), hex.EncodeToString(sum[:]))
		if l := py.line(t); l != want {
			t.Fatalf("python receiver: got %q, want %q", l, want)
		}
	}
	pub.Close()
	if l := py.line(t); l != "bye" {
		t.Fatalf("python receiver said %q after the root closed", l)
	}
	if code := py.wait(t); code != 0 {
		t.Fatalf("python receiver exited %d", code)
	}
}

// TestInteropPythonRejected: a libzmq receiver with another world size is
// refused with error code 4; the Go root goes on, and a Go rank 1 joins.
func TestInteropPythonRejected(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 20*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	py := startPython(t, "pyreceiver.py", rootAddr(t, ctx, cfgs[1]), "1", "5", cfgs[0].Group)
	if l := py.line(t); !strings.HasPrefix(l, "error 4 world size mismatch: rank 1 says 5, the root was opened with 2") {
		t.Fatalf("python receiver said %q", l)
	}
	roundTrip(t, ctx, pub, openSubscriber(t, ctx, cfgs[1]))
}

// TestInteropPythonRoot: Go receivers take every message from a libzmq
// root, in order, then see the end of the run (transport.ErrEnded) when it
// says BYE with every message acknowledged.
func TestInteropPythonRoot(t *testing.T) {
	ctx := testContext(t, time.Minute)
	const world, n = 3, 60
	py := startPython(t, "pyroot.py", strconv.Itoa(world), t.Name(), strconv.Itoa(n))
	addr, ok := strings.CutPrefix(py.line(t), "addr ")
	if !ok {
		t.Fatal("python root did not print its address")
	}
	ex := transporttest.NewMemExchange()
	ex.For(0).Put(ctx, AddrKey, []byte(addr))
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 1; r < world; r++ {
		wg.Go(func() {
			s, err := OpenSubscriber(ctx, transport.Config{Group: t.Name(), Rank: r, WorldSize: world, Device: mem.Host{}, Exchange: ex.For(r), Timeout: 20 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			defer s.Close()
			for k := range n {
				m, err := s.Recv(ctx)
				if err != nil {
					errs[r] = err
					return
				}
				want := bytes.Repeat([]byte(fmt.Sprintf("message %d ", k)), k%50+1)
				if m.Seq != uint64(k) || !bytes.Equal(m.Data, want) {
					errs[r] = fmt.Errorf("rank %d: message %d came as seq %d, %d bytes", r, k, m.Seq, len(m.Data))
					return
				}
				if err := s.Ack(ctx, m.Seq); err != nil {
					errs[r] = err
					return
				}
			}
			_, err = s.Recv(ctx)
			if !errors.Is(err, transport.ErrEnded) || errors.Is(err, transport.ErrPeerGone) || !strings.Contains(err.Error(), "root closed") {
				errs[r] = fmt.Errorf("rank %d after the last message: %v, want the end of the run", r, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if l := py.line(t); l != "done" {
		t.Fatalf("python root said %q", l)
	}
	if code := py.wait(t); code != 0 {
		t.Fatalf("python root exited %d", code)
	}
}
