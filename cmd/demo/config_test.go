package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/auth"
)

// TestSecretFileMode: a secret file that its group or other users may
// read or write is refused before anything starts, through the flag and
// through WEIGHTCAST_SECRET_FILE, with the mode found and the chmod that
// fixes it; mode 0600 is taken.
func TestSecretFileMode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte("a group secret of some length\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) string { return "" }
	if c, err := parseConfig([]string{"--secret-file", p}, noEnv); err != nil || c.secret == nil {
		t.Fatalf("mode 0600: %v", err)
	}
	for _, mode := range []os.FileMode{0o660, 0o640, 0o644} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		for _, how := range []struct {
			args   []string
			getenv func(string) string
		}{
			{[]string{"--secret-file", p}, noEnv},
			{nil, func(k string) string { return map[string]string{auth.SecretFileEnv: p}[k] }},
		} {
			_, err := parseConfig(how.args, how.getenv)
			var me *auth.SecretModeError
			if !errors.As(err, &me) || me.Mode != mode {
				t.Fatalf("mode %#o (args %q): %v; want an auth.SecretModeError", mode, how.args, err)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "--secret-file: ") || !strings.Contains(msg, "chmod 600 "+p) {
				t.Errorf("mode %#o: %q; want it to name --secret-file and chmod 600 %s", mode, msg, p)
			}
		}
	}
}

// TestServedRendezvousNeedsNoRunID: a rank started with torchrun's
// variables, where rank 0 serves the rendezvous, needs no run id (also
// with torchrun's default TORCHELASTIC_RUN_ID=none); one given
// --rendezvous still does.
func TestServedRendezvousNeedsNoRunID(t *testing.T) {
	for _, runID := range []string{"", "none"} {
		for _, rank := range []string{"0", "1"} {
			env := map[string]string{"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": runID}
			c, err := parseConfig(nil, func(k string) string { return env[k] })
			if err != nil {
				t.Fatalf("rank %s, TORCHELASTIC_RUN_ID=%q: %v", rank, runID, err)
			}
			if c.runID != "" || !c.served {
				t.Fatalf("rank %s: run id %q, served %v; want none, served", rank, c.runID, c.served)
			}
		}
	}
	_, err := parseConfig([]string{"--rank", "1", "--world-size", "2", "--rendezvous", "etcd://127.0.0.1:2379"}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "--rank needs --run-id") {
		t.Fatalf("--rendezvous without --run-id: %v; want it refused", err)
	}
}

// TestSizeTooSmall: --size 0, or a size below the smallest synthetic model
// of the tensors asked for, is refused naming the least that works.
func TestSizeTooSmall(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--size", "0"}, "--size 0: a model needs at least one byte"},
		{[]string{"--size", "1KiB"}, "--size 1KiB: the smallest synthetic model of 291 tensors of BF16 is"},
		{[]string{"--size", "100", "--tensors", "10"}, "give --size 144 or more, or fewer --tensors"},
	} {
		if _, err := parseConfig(tc.args, noEnv); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v; want an error saying %q", tc.args, err, tc.want)
		}
	}
	if _, err := parseConfig([]string{"--size", "144", "--tensors", "10"}, noEnv); err != nil {
		t.Errorf("the smallest model that can be made: %v", err)
	}
}

// TestHostBucketsOfEveryLocalRank: the host memory check counts the two
// buckets of every rank on this machine, not of one.
func TestHostBucketsOfEveryLocalRank(t *testing.T) {
	const avail = 24 << 30
	parse := func(env map[string]string, args ...string) *config {
		t.Helper()
		c, err := parseConfig(args, func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	err := parse(nil, "--bucket", "10GiB", "--ranks", "4").checkHostBuckets(avail)
	if err == nil || !strings.Contains(err.Error(), "the 4 ranks on this machine hold two buckets each in host memory (80 GiB in all), more than the 24 GiB this machine has available") {
		t.Errorf("4 local ranks of 10 GiB buckets on 24 GiB: %v", err)
	}
	if err := parse(nil, "--bucket", "5GiB", "--ranks", "2").checkHostBuckets(avail); err != nil {
		t.Errorf("2 local ranks of 5 GiB buckets on 24 GiB: %v", err)
	}
	rankArgs := []string{"--bucket", "10GiB", "--rank", "1", "--world-size", "4", "--rendezvous", "etcd://127.0.0.1:1", "--run-id", "x"}
	if err := parse(nil, rankArgs...).checkHostBuckets(avail); err != nil {
		t.Errorf("one rank of its own with 10 GiB buckets on 24 GiB: %v", err)
	}
	err = parse(map[string]string{"LOCAL_WORLD_SIZE": "2"}, rankArgs...).checkHostBuckets(avail)
	if err == nil || !strings.Contains(err.Error(), "the 2 ranks on this machine") {
		t.Errorf("LOCAL_WORLD_SIZE=2 ranks of 10 GiB buckets on 24 GiB: %v", err)
	}
}

// TestConfigFieldsAsFlags: a setting the library refuses
// (weightcast.Options.Validate) is reported by the demo's flag, with the
// value as typed, and still matches the library's *weightcast.FieldError.
func TestConfigFieldsAsFlags(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		args        []string
		field, want string
	}{
		{[]string{"--bucket", "100"}, "bucket", "--bucket 100 is below the minimum of 1.0 KiB"},
		{[]string{"--bucket", "2TiB"}, "bucket", "--bucket 2TiB is over the limit of 1.0 TiB"},
		{[]string{"--timeout", "-1s"}, "timeout", "--timeout -1s: give a positive duration"},
		{[]string{"--group", "a/b"}, "group", `--group "a/b": a group name must be`},
		{[]string{"--run-id", "owner"}, "run_id", `--run-id "owner": a run id must be`},
		{[]string{"--transport", "udp"}, "transport", `--transport "udp": choose auto, `},
		{[]string{"--rendezvous", "h:1"}, "rendezvous", `--rendezvous "h:1": want etcd://HOST:PORT`},
		{[]string{"--quantize-include", "x"}, "quantize", "--quantize: quantize: include and exclude patterns given without a scheme"},
		{[]string{"--bucket-mac", "md5"}, "bucket_mac", `--bucket-mac "md5": choose "blake3" or "poly1305-aes"`},
	} {
		_, err := parseConfig(tc.args, noEnv)
		var fe *weightcast.FieldError
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, weightcast.ErrConfig) {
			t.Errorf("%q: %v; want %q, a FieldError of %q", tc.args, err, tc.want, tc.field)
		}
	}
	c, err := parseConfig(nil, noEnv)
	if err != nil || c.opts.Timeout != weightcast.DefaultTimeout || c.opts.BucketSize != 256<<20 || c.opts.Group != "weightcast-demo" {
		t.Fatalf("defaults: %+v, %v", c.opts, err)
	}
}
