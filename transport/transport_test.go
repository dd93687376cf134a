package transport_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
)

// This test binary imports no transport package, as a program that forgot
// the import does not.

func config() transport.Config {
	return transport.Config{Group: "g", Rank: 0, WorldSize: 2, Device: mem.Host{}, Timeout: time.Second}
}

// TestUnknownBuiltinNamesItsImport: Open of a built-in transport whose
// package is not linked says which import line registers it.
func TestUnknownBuiltinNamesItsImport(t *testing.T) {
	for name, pkg := range map[string]string{
		"tcp":    "github.com/weightcast/weightcast/transport/tcp",
		"inproc": "github.com/weightcast/weightcast/transport/inproc",
		"ipc":    "github.com/weightcast/weightcast/transport/ipc",
		"nccl":   "github.com/weightcast/weightcast/transport/ncclx",
	} {
		if got := transport.BuiltinPackage(name); got != pkg {
			t.Errorf("BuiltinPackage(%q) = %q, want %q", name, got, pkg)
		}
		_, err := transport.Open(context.Background(), name, config())
		if !errors.Is(err, transport.ErrUnknownTransport) {
			t.Fatalf("Open(%q) = %v; want ErrUnknownTransport", name, err)
		}
		if want := `import _ "` + pkg + `"`; !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v; want it to name the import line %s", name, err, want)
		}
	}
}

// TestUnknownNameListsTransports: a name that is neither registered nor
// built in gets the registered and the built-in names.
func TestUnknownNameListsTransports(t *testing.T) {
	if got := transport.BuiltinPackage("pigeon"); got != "" {
		t.Fatalf("BuiltinPackage(pigeon) = %q", got)
	}
	_, err := transport.Open(context.Background(), "pigeon", config())
	if !errors.Is(err, transport.ErrUnknownTransport) {
		t.Fatalf("Open(pigeon) = %v; want ErrUnknownTransport", err)
	}
	for _, want := range []string{`"pigeon"`, "registered: ", "built in: inproc, ipc, nccl, tcp"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(pigeon) = %v; want it to say %q", err, want)
		}
	}
}

type fakeEndpoint struct{}

func (fakeEndpoint) Broadcast(context.Context, uint64, mem.Buffer, int) error { return nil }
func (fakeEndpoint) Close() error                                             { return nil }

// TestRegister opens a registered transport, lists it, validates the
// config first, and refuses a second registration of a name.
// fakeOpened is what the test-fake transport was last opened with;
// registerFake registers it once per process (registration is global, and
// -count runs a test again in the same process).
var (
	fakeOpened   transport.Config
	registerFake sync.Once
)

func TestRegister(t *testing.T) {
	registerFake.Do(func() {
		transport.Register("test-fake", func(ctx context.Context, cfg transport.Config) (transport.Endpoint, error) {
			fakeOpened = cfg
			return fakeEndpoint{}, nil
		})
	})
	if !slices.Contains(transport.Names(), "test-fake") {
		t.Fatalf("Names() = %v, want test-fake among them", transport.Names())
	}
	if _, err := transport.Open(context.Background(), "test-fake", config()); err != nil || fakeOpened.Group != "g" {
		t.Fatalf("Open = %v, opened %+v", err, fakeOpened)
	}
	bad := config()
	bad.WorldSize = 1
	if _, err := transport.Open(context.Background(), "test-fake", bad); err == nil || !strings.Contains(err.Error(), "world size 1") {
		t.Fatalf("Open with a world of one: %v", err)
	}
	_, err := transport.Open(context.Background(), "pigeon", config())
	if err == nil || !strings.Contains(err.Error(), "registered: test-fake;") {
		t.Errorf("unknown name: %v; want the registered names", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("a second Register of test-fake did not panic")
		}
	}()
	transport.Register("test-fake", func(context.Context, transport.Config) (transport.Endpoint, error) { return nil, nil })
}
