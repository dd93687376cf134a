package ncclx

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// These tests need no GPU: Open refuses what it cannot use before touching
// CUDA or NCCL.

func TestOpenRefuses(t *testing.T) {
	cases := []struct {
		name string
		edit func(*transport.Config)
		want string
	}{
		{"host memory", func(c *transport.Config) {}, "not a CUDA GPU"},
		{"rebuild each round", func(c *transport.Config) { c.Options = map[string]string{"rebuild": "each-round"} }, "Rebuild on every rank"},
		{"unknown rebuild", func(c *transport.Config) { c.Options = map[string]string{"rebuild": "sometimes"} }, `rebuild="sometimes"`},
		{"no exchange", func(c *transport.Config) { c.Device, c.Exchange = &gpu.CUDADevice{}, nil }, "no Exchange"},
		{"world of one", func(c *transport.Config) { c.WorldSize = 1 }, "world size 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := transporttest.Configs("g", 2, time.Second)[1]
			c.edit(&cfg)
			_, err := transport.Open(context.Background(), Name, cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open: %v, want an error about %q", err, c.want)
			}
			var te *transport.Error
			if c.name != "world of one" && !errors.As(err, &te) {
				t.Fatalf("Open's error is not a *transport.Error: %v", err)
			}
		})
	}
}

// TestConformance runs the transport suite (see conformance). It comes
// last: its final case kills a peer in the middle of a collective, which
// may leave this process's CUDA context unusable.
func TestConformance(t *testing.T) { conformance.Run(t) }
