package weightcast

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/stages"
)

// plainOptions is Options without its JSON methods, so that optionsJSON
// can embed it and take its json-tagged fields as they are.
type plainOptions Options

// optionsJSON is the one translator between Options and its JSON object:
// the fields of Options whose JSON form is not their Go form are spelled
// here, shadowing the embedded ones (a shallower field wins); the rest are
// Options' own json tags. The C library and Python use these keys.
type optionsJSON struct {
	*plainOptions
	Rank            *int            `json:"rank,omitempty"`
	WorldSize       *int            `json:"world_size,omitempty"`
	Bucket          json.RawMessage `json:"bucket,omitempty"`
	Timeout         *float64        `json:"timeout,omitempty"`
	Checksum        *bool           `json:"checksum,omitempty"`
	Direct          *bool           `json:"direct,omitempty"`
	Turns           *bool           `json:"turns,omitempty"`
	DType           string          `json:"dtype,omitempty"`
	Quantize        string          `json:"quantize,omitempty"`
	QuantizeInclude []string        `json:"quantize_include,omitempty"`
	QuantizeExclude []string        `json:"quantize_exclude,omitempty"`
	TLSCA           string          `json:"tls_ca,omitempty"`
	TLSCert         string          `json:"tls_cert,omitempty"`
	TLSKey          string          `json:"tls_key,omitempty"`
}

// MarshalJSON encodes the settings that have a JSON form (not Secret, only
// SecretFile; not the Go values such as Endpoint or Logger), so that
// UnmarshalJSON gives them back.
func (o Options) MarshalJSON() ([]byte, error) {
	w := optionsJSON{plainOptions: (*plainOptions)(&o), QuantizeInclude: o.Quantize.Include, QuantizeExclude: o.Quantize.Exclude,
		TLSCA: o.TLS.CA, TLSCert: o.TLS.Cert, TLSKey: o.TLS.Key, Quantize: string(o.Quantize.Scheme)}
	if o.Rank >= 0 {
		w.Rank = &o.Rank
	}
	if o.WorldSize != 0 {
		w.WorldSize = &o.WorldSize
	}
	if o.BucketSize != 0 {
		w.Bucket = json.RawMessage(strconv.FormatInt(o.BucketSize, 10))
	}
	if o.Timeout != 0 {
		s := o.Timeout.Seconds()
		w.Timeout = &s
	}
	if o.NoChecksum {
		w.Checksum = new(bool)
	}
	if o.NoDirect {
		w.Direct = new(bool)
	}
	if o.NoTurns {
		w.Turns = new(bool)
	}
	if o.RolloutDType != dtype.Invalid {
		w.DType = strings.ToLower(o.RolloutDType.String())
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes the JSON object of the C library into o: keys it
// leaves out keep o's values (so a caller presets Rank -1, "from RANK"),
// unknown keys are refused, and a value that cannot be one of its field's
// is a *FieldError. "bucket" is bytes or a size such as "256MiB";
// "timeout" is seconds; "checksum" and "direct" false turn those off;
// "dtype" is "bf16", "f16", "f32" or "keep". Validate checks the rest.
func (o *Options) UnmarshalJSON(b []byte) error {
	w := optionsJSON{plainOptions: (*plainOptions)(o)}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if w.Rank != nil {
		if *w.Rank < 0 {
			return fieldError("rank", *w.Rank, " is negative")
		}
		o.Rank = *w.Rank
	}
	if w.WorldSize != nil {
		if *w.WorldSize <= 0 {
			return fieldError("world_size", *w.WorldSize, ": a group needs a sender and at least one receiver")
		}
		o.WorldSize = *w.WorldSize
	}
	if o.ServeRendezvous && o.Rendezvous == "" {
		return fieldError("serve_rendezvous", nil, ` needs rendezvous "etcd://HOST:PORT", the address rank 0 serves it at`)
	}
	if len(w.Bucket) > 0 && string(w.Bucket) != "null" {
		n, err := parseBucket(w.Bucket)
		if err != nil {
			return err
		}
		o.BucketSize = n
	}
	if w.Timeout != nil {
		if *w.Timeout <= 0 {
			return fieldError("timeout", strconv.FormatFloat(*w.Timeout, 'g', -1, 64), ": give a positive number of seconds")
		}
		o.Timeout = time.Duration(*w.Timeout * float64(time.Second))
	}
	if w.Checksum != nil {
		o.NoChecksum = !*w.Checksum
	}
	if w.Direct != nil {
		o.NoDirect = !*w.Direct
	}
	if w.Turns != nil {
		o.NoTurns = !*w.Turns
	}
	switch d := strings.ToLower(strings.TrimSpace(w.DType)); d {
	case "", "keep":
	default:
		t, err := dtype.Parse(d)
		if err != nil || (t != dtype.BF16 && t != dtype.F16 && t != dtype.F32) {
			return fieldError("dtype", fmt.Sprintf("%q", w.DType), `: choose "bf16", "f16" or "f32" (floating tensors are cast to it on the sender), or "keep"`)
		}
		o.RolloutDType = t
	}
	if w.Quantize != "" || len(w.QuantizeInclude) > 0 || len(w.QuantizeExclude) > 0 {
		sc, err := quant.ParseScheme(w.Quantize)
		if err != nil {
			fe := fieldError("quantize", nil, ": %v", err)
			fe.Err = err
			return fe
		}
		o.Quantize = stages.QuantizeConfig{Scheme: sc, Include: w.QuantizeInclude, Exclude: w.QuantizeExclude}
	}
	if w.TLSCA != "" || w.TLSCert != "" || w.TLSKey != "" {
		o.TLS = auth.TLSFiles{CA: w.TLSCA, Cert: w.TLSCert, Key: w.TLSKey}
	}
	return nil
}

// parseBucket reads "bucket": a positive number of bytes or a size such
// as "256MiB".
func parseBucket(raw json.RawMessage) (int64, error) {
	var n int64
	var s string
	switch {
	case json.Unmarshal(raw, &n) == nil:
	case json.Unmarshal(raw, &s) == nil:
		v, err := humanize.ParseBytes(s)
		if err != nil || v > 1<<62 {
			return 0, fieldError("bucket", fmt.Sprintf("%q", s), `: want a size such as "256MiB" or "1GiB"`)
		}
		n = int64(v)
	default:
		return 0, fieldError("bucket", string(raw), `: want bytes or a size such as "1GiB"`)
	}
	if n <= 0 {
		return 0, fieldError("bucket", string(raw), " must be positive")
	}
	return n, nil
}
