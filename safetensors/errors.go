package safetensors

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every error this package returns is an *Error whose Err
// wraps one of these, so callers can test the kind with errors.Is.
var (
	// ErrHeaderJSON: the header is not valid UTF-8 JSON, or its JSON does not
	// have the safetensors shape (a tensor entry without "dtype", a metadata
	// value that is not a string, ...).
	ErrHeaderJSON = errors.New("header is not valid safetensors JSON")
	// ErrHeaderSize: the 8-byte header length is larger than the limit or
	// than the file.
	ErrHeaderSize = errors.New("bad header length")
	// ErrTruncated: the file ends before the data the header describes.
	ErrTruncated = errors.New("file is truncated")
	// ErrOffsets: a tensor's data_offsets are reversed or out of range.
	ErrOffsets = errors.New("bad data offsets")
	// ErrOverlap: two tensors share bytes of the data region.
	ErrOverlap = errors.New("tensors overlap")
	// ErrGap: some bytes of the data region belong to no tensor.
	ErrGap = errors.New("data region has bytes that belong to no tensor")
	// ErrDType: a dtype this package does not know.
	ErrDType = errors.New("unknown dtype")
	// ErrShape: a shape whose byte length does not match the data offsets,
	// or that overflows.
	ErrShape = errors.New("shape does not match data")
	// ErrNegativeDim: a shape with a negative dimension.
	ErrNegativeDim = errors.New("negative dimension")
	// ErrName: a tensor name that is empty, reserved or not valid UTF-8.
	ErrName = errors.New("bad tensor name")
	// ErrDuplicate: the same tensor name twice, in one header or across the
	// shards of a model.
	ErrDuplicate = errors.New("duplicate tensor name")
	// ErrLimit: more tensors, a longer name or a higher rank than the Limits
	// allow.
	ErrLimit = errors.New("limit exceeded")
	// ErrIndex: a model index file that cannot be used (bad JSON, no
	// weight_map, a shard path that leaves the directory).
	ErrIndex = errors.New("bad model index")
	// ErrMissingShard: the index names a shard file that does not exist.
	ErrMissingShard = errors.New("missing shard")
	// ErrIndexMismatch: the index's weight_map disagrees with the tensors
	// the shards hold.
	ErrIndexMismatch = errors.New("index does not match shards")
	// ErrNotFound: no tensor of that name.
	ErrNotFound = errors.New("tensor not found")
	// ErrWrite: a write outside a tensor, over bytes already written, or
	// after the writer failed or closed.
	ErrWrite = errors.New("bad write")
	// ErrIncomplete: Close found tensor bytes that were never written.
	ErrIncomplete = errors.New("incomplete file")
)

// Error is the error type of this package. It names the file and, where
// one is to blame, the tensor.
type Error struct {
	// File is the path of the file (or directory) concerned; empty when
	// parsing bytes that came from no file.
	File string
	// Tensor is the tensor concerned, or empty.
	Tensor string
	// Err says what is wrong; it wraps one of the Err* sentinels.
	Err error
}

// Error formats the error as "safetensors: <file>: tensor "<name>": <what>".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("safetensors: ")
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Tensor != "" {
		fmt.Fprintf(&b, "tensor %q: ", shorten(e.Tensor))
	}
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// errorf builds an *Error whose Err wraps kind.
func errorf(file, tensor string, kind error, format string, args ...any) *Error {
	return &Error{File: file, Tensor: tensor, Err: fmt.Errorf("%w: "+format, append([]any{kind}, args...)...)}
}

// withFile sets the file of err when it is an *Error without one, and wraps
// other errors into an *Error for file.
func withFile(err error, file string) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		if e.File == "" {
			e.File = file
		}
		return e
	}
	return &Error{File: file, Err: err}
}

// shorten keeps error messages readable when a name is huge.
func shorten(s string) string {
	const max = 200
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && (s[cut]&0xC0) == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:cut], len(s))
}

// fmtAt appends the byte position to a header syntax error.
func fmtAt(err error, pos int) error {
	return fmt.Errorf("%w (at byte %d of the header)", err, pos)
}
