package weightcast

import (
	"context"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
)

// TestServedRendezvousNeedsNoRunID: with only the variables the README's
// snippet names (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and with
// torchrun's default TORCHELASTIC_RUN_ID=none, every rank opens and a round
// goes through: rank 0 serves the rendezvous, makes up the run id there and
// the others read it from the server they dial. Two launches on one address
// get two run ids; with a group secret the published id is signed.
func TestServedRendezvousNeedsNoRunID(t *testing.T) {
	secretPath := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretPath, []byte("a group secret for the served run id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secret, err := auth.ReadSecretFile(secretPath)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	seen := map[string]bool{}
	for _, tc := range []struct {
		name   string
		env    map[string]string
		secret *auth.Secret
	}{
		{"README variables", map[string]string{}, nil},
		{"TORCHELASTIC_RUN_ID=none, secret", map[string]string{"TORCHELASTIC_RUN_ID": "none"}, secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const world = 3
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			opts := make([]Options, world)
			for r := range world {
				env := map[string]string{"RANK": string(rune('0' + r)), "WORLD_SIZE": "3", "MASTER_ADDR": host, "MASTER_PORT": port}
				for k, v := range tc.env {
					env[k] = v
				}
				o, err := Options{Rank: -1, BucketSize: 8 << 10, Group: "served", Device: "cpu", Timeout: 30 * time.Second, Secret: tc.secret}.FromEnv(func(k string) string { return env[k] })
				if err != nil {
					t.Fatalf("rank %d: FromEnv: %v", r, err)
				}
				if o.RunID != "" || !o.ServeRendezvous {
					t.Fatalf("rank %d: FromEnv gave run id %q, ServeRendezvous %v; want none, and a served rendezvous", r, o.RunID, o.ServeRendezvous)
				}
				opts[r] = o
			}
			s, rs := openRanks(t, opts)
			id := s.RunID()
			if !strings.HasPrefix(id, "served-") || seen[id] {
				t.Fatalf("rank 0's run id %q: want a fresh served-… id (seen: %v)", id, seen)
			}
			seen[id] = true
			for _, r := range rs {
				if r.RunID() != id {
					t.Fatalf("rank %d runs as %q, rank 0 as %q", r.Rank(), r.RunID(), id)
				}
			}
			src := randomTensors(rand.New(rand.NewPCG(5, 6)), 10, 8<<10)
			models := []*sink.HostModel{sink.NewHostModel(), sink.NewHostModel()}
			send := func(ctx context.Context) error { _, err := s.Send(ctx, src, 1); return err }
			if err := syncRound(ctx, s, rs, send, []stages.Sink{models[0], models[1]}); err != nil {
				t.Fatal(err)
			}
			checkModels(t, src, models)
		})
	}
}
