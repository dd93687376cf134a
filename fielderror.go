package weightcast

import "fmt"

// FieldError is a configuration setting that cannot work, named by its
// field: the JSON key of Options ("bucket", "timeout", "group"), never a
// front end's spelling of it. Every front end reports it in its own words
// (errors.As finds it): the demo as its flag ("--bucket 100 is below …"),
// Python as its keyword ("bucket=100 is below …"), C callers and Go as
// the key ("bucket 100 is below …"). It matches ErrConfig and its cause.
type FieldError struct {
	// Field is the JSON key of the setting.
	Field string
	// Value is what was given, as text (strings quoted), or empty where
	// the message does not repeat it.
	Value string
	// Problem is the rest of the message after the field and value,
	// with its own leading separator: " is below …" or ": want …".
	Problem string
	// Err is the cause, when there is one (an auth.SecretModeError).
	Err error
}

// Error names the field by its JSON key.
func (e *FieldError) Error() string { return e.Spell(e.Field, " ") }

// Spell renders the error with the field named as name, joined to the
// value by sep: Spell("--bucket", " ") or Spell("bucket", "=").
func (e *FieldError) Spell(name, sep string) string {
	if e.Value == "" {
		return name + e.Problem
	}
	return name + sep + e.Value + e.Problem
}

// Spelled is the error spelled as Spell says, still matching e (and so
// ErrConfig and e.Err) for errors.Is and errors.As.
func (e *FieldError) Spelled(name, sep string) error {
	return &spelledError{text: e.Spell(name, sep), field: e}
}

// Unwrap returns ErrConfig and the cause.
func (e *FieldError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrConfig}
	}
	return []error{ErrConfig, e.Err}
}

// fieldError makes a FieldError; value is formatted with %v (use %q
// yourself for strings: pass fmt.Sprintf("%q", s)).
func fieldError(field string, value any, format string, args ...any) *FieldError {
	v := ""
	if value != nil {
		v = fmt.Sprint(value)
	}
	return &FieldError{Field: field, Value: v, Problem: fmt.Sprintf(format, args...)}
}

// spelledError is a FieldError in a front end's words.
type spelledError struct {
	text  string
	field *FieldError
}

func (e *spelledError) Error() string { return e.text }
func (e *spelledError) Unwrap() error { return e.field }
