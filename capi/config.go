//go:build cgo

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/weightcast/weightcast"
)

// parseConfig turns the JSON configuration wc_open_sender and
// wc_open_receiver take into Options: the object is weightcast.Options'
// own JSON (its keys are the library's field names), plus "env", the
// environment the torchrun variables are read from instead of the
// process's (a Python caller passes os.environ's, which the Go runtime's
// copy does not follow). A null or missing rank, world_size, rendezvous,
// run_id, device or secret_file comes from those variables; Validate then
// fills the defaults and checks every setting.
func parseConfig(text string, getenv func(string) string) (weightcast.Options, error) {
	o := weightcast.Options{Rank: -1, HostMemory: cHost{}}
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &top); err != nil || top == nil {
		if err == nil {
			err = errors.New("want a JSON object")
		}
		return o, fmt.Errorf("%w: configuration %s: %v", weightcast.ErrConfig, text, err)
	}
	if raw, ok := top["env"]; ok {
		var env map[string]string
		if err := json.Unmarshal(raw, &env); err != nil {
			return o, fmt.Errorf("%w: configuration %s: env: %v", weightcast.ErrConfig, text, err)
		}
		if env != nil {
			getenv = func(k string) string { return env[k] }
		}
		delete(top, "env")
	}
	rest, err := json.Marshal(top)
	if err != nil {
		return o, fmt.Errorf("%w: configuration %s: %v", weightcast.ErrConfig, text, err)
	}
	if err := json.Unmarshal(rest, &o); err != nil {
		if errors.As(err, new(*weightcast.FieldError)) {
			return o, err
		}
		return o, fmt.Errorf("%w: configuration %s: %v", weightcast.ErrConfig, text, err)
	}
	// The settings first, so that a bad one is named even where the
	// torchrun variables are missing; again after FromEnv, which may name
	// the secret's file.
	if err := o.Validate(); err != nil {
		return o, err
	}
	if o, err = o.FromEnv(getenv); err != nil {
		return o, err
	}
	return o, o.Validate()
}

// fieldDetail is what wc_last_error_field reports of err: when err is
// about one configuration field (a *weightcast.FieldError whose text ends
// err's), a JSON object of the field, its value and problem, and the text
// before them, so that a front end can name the field its own way; else "".
func fieldDetail(err error) string {
	var fe *weightcast.FieldError
	if !errors.As(err, &fe) {
		return ""
	}
	prefix, ok := strings.CutSuffix(err.Error(), fe.Error())
	if !ok {
		return ""
	}
	b, _ := json.Marshal(map[string]string{"field": fe.Field, "value": fe.Value, "problem": fe.Problem, "prefix": prefix})
	return string(b)
}

var getenv = os.Getenv
