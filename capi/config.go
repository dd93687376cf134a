//go:build cgo

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/stages"
)

// config is the JSON object wc_open_sender and wc_open_receiver take; a
// null or missing rank, world_size, rendezvous, run_id or device comes from
// the torchrun variables, read from "env" when it is given.
type config struct {
	Group      string          `json:"group"`
	Rank       *int            `json:"rank"`
	WorldSize  *int            `json:"world_size"`
	Rendezvous *string         `json:"rendezvous"`
	RunID      *string         `json:"run_id"`
	Transport  string          `json:"transport"`
	Bucket     json.RawMessage `json:"bucket"`
	Timeout    *float64        `json:"timeout"`
	Checksum   *bool           `json:"checksum"`
	Device     *string         `json:"device"`
	Advertise  string          `json:"advertise"`
	// ServeRendezvous has rank 0 serve the rendezvous (an embedded etcd)
	// at Rendezvous's address, as it does under torchrun, for callers that
	// place ranks themselves (verl's build_topology) instead of through
	// the torchrun variables.
	ServeRendezvous bool `json:"serve_rendezvous"`
	// DType is the rollout dtype the sender casts floating tensors to:
	// "bf16", "f16", "f32", or "" / "keep" to send them as they are.
	DType string `json:"dtype"`
	// Quantize is the sender's rollout quantization ("fp8-block", or
	// "none"), QuantizeInclude and QuantizeExclude the name patterns of
	// stages.QuantizeConfig.
	Quantize        string   `json:"quantize"`
	QuantizeInclude []string `json:"quantize_include"`
	QuantizeExclude []string `json:"quantize_exclude"`
	// SecretFile names the group secret's file (mode 0600); empty means
	// WEIGHTCAST_SECRET_FILE, or no secret. TLSCA, TLSCert and TLSKey are
	// the PEM files of mutual TLS.
	SecretFile string `json:"secret_file"`
	TLSCA      string `json:"tls_ca"`
	TLSCert    string `json:"tls_cert"`
	TLSKey     string `json:"tls_key"`
	// Env, when present, is the environment the torchrun variables are
	// read from instead of the process's (a Python caller passes
	// os.environ's, which the Go runtime's copy does not follow).
	Env map[string]string `json:"env"`
}

// parseConfig turns the JSON configuration into Options, the torchrun
// variables filling what it leaves out.
func parseConfig(text string, getenv func(string) string) (weightcast.Options, error) {
	var c config
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return weightcast.Options{}, fmt.Errorf("%w: configuration %s: %v", weightcast.ErrConfig, text, err)
	}
	o := weightcast.Options{Group: c.Group, Rank: -1, Transport: c.Transport, Advertise: c.Advertise, HostMemory: cHost{}}
	if c.Rank != nil {
		if *c.Rank < 0 {
			return o, fmt.Errorf("%w: rank %d is negative", weightcast.ErrConfig, *c.Rank)
		}
		o.Rank = *c.Rank
	}
	if c.WorldSize != nil {
		if *c.WorldSize <= 0 {
			return o, fmt.Errorf("%w: world size %d: a group needs a sender and at least one receiver", weightcast.ErrConfig, *c.WorldSize)
		}
		o.WorldSize = *c.WorldSize
	}
	if c.Rendezvous != nil {
		o.Rendezvous = *c.Rendezvous
	}
	if c.RunID != nil {
		o.RunID = *c.RunID
	}
	if c.Device != nil {
		o.Device = *c.Device
	}
	if c.ServeRendezvous {
		if c.Rendezvous == nil {
			return o, fmt.Errorf("%w: serve_rendezvous needs rendezvous \"etcd://HOST:PORT\", the address rank 0 serves it at", weightcast.ErrConfig)
		}
		o.ServeRendezvous = true
	}
	switch d := strings.ToLower(strings.TrimSpace(c.DType)); d {
	case "", "keep":
	default:
		t, err := dtype.Parse(d)
		if err != nil || (t != dtype.BF16 && t != dtype.F16 && t != dtype.F32) {
			return o, fmt.Errorf("%w: dtype %q: choose \"bf16\", \"f16\" or \"f32\" (floating tensors are cast to it on the sender), or \"keep\"", weightcast.ErrConfig, c.DType)
		}
		o.RolloutDType = t
	}
	if c.Checksum != nil {
		o.NoChecksum = !*c.Checksum
	}
	if c.Quantize != "" || len(c.QuantizeInclude) > 0 || len(c.QuantizeExclude) > 0 {
		sc, err := quant.ParseScheme(c.Quantize)
		if err != nil {
			return o, fmt.Errorf("%w: quantize: %v", weightcast.ErrConfig, err)
		}
		o.Quantize = stages.QuantizeConfig{Scheme: sc, Include: c.QuantizeInclude, Exclude: c.QuantizeExclude}
		if _, err := stages.Quantize(stages.Tensors{}, o.Quantize); err != nil {
			return o, fmt.Errorf("%w: %v", weightcast.ErrConfig, err)
		}
	}
	if c.Timeout != nil {
		if *c.Timeout <= 0 {
			return o, fmt.Errorf("%w: timeout %v s: give a positive number of seconds", weightcast.ErrConfig, *c.Timeout)
		}
		o.Timeout = time.Duration(*c.Timeout * float64(time.Second))
	}
	if len(c.Bucket) > 0 && string(c.Bucket) != "null" {
		var n int64
		var s string
		switch {
		case json.Unmarshal(c.Bucket, &n) == nil:
		case json.Unmarshal(c.Bucket, &s) == nil:
			v, err := humanize.ParseBytes(s)
			if err != nil {
				return o, fmt.Errorf("%w: bucket %q: want a size such as \"256MiB\" or \"1GiB\"", weightcast.ErrConfig, s)
			}
			n = int64(v)
		default:
			return o, fmt.Errorf("%w: bucket %s: want bytes or a size such as \"1GiB\"", weightcast.ErrConfig, c.Bucket)
		}
		if n <= 0 {
			return o, fmt.Errorf("%w: bucket %s: must be positive", weightcast.ErrConfig, c.Bucket)
		}
		o.BucketSize = n
	}
	if c.Env != nil {
		getenv = func(k string) string { return c.Env[k] }
	}
	if c.SecretFile == "" {
		c.SecretFile = getenv(auth.SecretFileEnv)
	}
	if c.SecretFile != "" {
		secret, err := auth.ReadSecretFile(c.SecretFile)
		if err != nil {
			return o, fmt.Errorf("%w: secret_file: %w", weightcast.ErrConfig, err)
		}
		o.Secret = secret
	}
	o.TLS = auth.TLSFiles{CA: c.TLSCA, Cert: c.TLSCert, Key: c.TLSKey}
	return o.FromEnv(getenv)
}

var getenv = os.Getenv
