package nccl

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Result is an ncclResult_t. Its Error method names the code from a
// built-in table, so it reads well even where NCCL is not installed.
type Result int

// The ncclResult_t values (nccl.h). Timeout exists from NCCL 2.29 on.
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	Timeout            Result = 8

	// functionNotFound is the shim's code for a symbol the loaded library
	// lacks (or no library loaded); it is no NCCL code
	// (WC_NCCL_FUNCTION_NOT_FOUND of nccl_shim.h).
	functionNotFound Result = 0x7fff0001
)

var resultNames = [...]struct{ name, text string }{
	Success:            {"ncclSuccess", "no error"},
	UnhandledCudaError: {"ncclUnhandledCudaError", "a call to a CUDA function failed"},
	SystemError:        {"ncclSystemError", "a call to the system failed (sockets, shared memory, threads)"},
	InternalError:      {"ncclInternalError", "an internal check failed: an NCCL bug or memory corruption"},
	InvalidArgument:    {"ncclInvalidArgument", "invalid argument"},
	InvalidUsage:       {"ncclInvalidUsage", "invalid usage (e.g. two ranks of one communicator on one GPU)"},
	RemoteError:        {"ncclRemoteError", "a remote rank exited or the network failed"},
	InProgress:         {"ncclInProgress", "the operation is still in progress"},
	Timeout:            {"ncclTimeout", "the operation timed out"},
}

// Name returns the code's name in nccl.h ("ncclInvalidUsage").
func (r Result) Name() string {
	if r == functionNotFound {
		return "FUNCTION_NOT_FOUND"
	}
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r].name
	}
	return fmt.Sprintf("ncclResult(%d)", int(r))
}

// Error returns the name, the number and a description.
func (r Result) Error() string {
	if r == functionNotFound {
		return "function not found in the loaded NCCL library (or no library loaded)"
	}
	if r >= 0 && int(r) < len(resultNames) {
		return fmt.Sprintf("%s (%d): %s", resultNames[r].name, int(r), resultNames[r].text)
	}
	return fmt.Sprintf("ncclResult(%d): unknown NCCL result", int(r))
}

// Is makes errors.Is(r, ErrNoLibrary) true for a missing function.
func (r Result) Is(target error) bool { return target == ErrNoLibrary && r == functionNotFound }

// ErrClosed is returned by operations on a communicator that was closed or
// aborted.
var ErrClosed = errors.New("nccl: communicator closed or aborted")

// Error is a failed NCCL operation of one rank. It unwraps to the Result
// (when NCCL returned one) and to Err (the context's error, when a wait was
// cut short).
type Error struct {
	Op      string // "init", "broadcast", "finalize", "destroy", "abort"
	Label   string // the communicator's label (the caller's group name), may be empty
	Rank    int    // this rank, -1 when no communicator is involved
	NRanks  int
	Result  Result // Success when Err says what went wrong
	Detail  string // ncclGetLastError's text, when NCCL left one
	Err     error  // context.Canceled / DeadlineExceeded, or another cause
	Aborted bool   // the communicator was aborted (ncclCommAbort) because of this error
}

// Error names the operation, the communicator, the result and NCCL's own message.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("nccl " + e.Op)
	if e.Label != "" {
		fmt.Fprintf(&b, ": comm %q", e.Label)
	} else if e.Rank >= 0 {
		b.WriteString(":")
	}
	if e.Rank >= 0 {
		fmt.Fprintf(&b, " rank %d of %d", e.Rank, e.NRanks)
	}
	switch {
	case e.Err != nil && e.Result != Success:
		fmt.Fprintf(&b, ": %v: %v", e.Err, e.Result)
	case e.Err != nil:
		fmt.Fprintf(&b, ": %v", e.Err)
	default:
		fmt.Fprintf(&b, ": %v", e.Result)
	}
	if e.Detail != "" {
		fmt.Fprintf(&b, " (NCCL says: %s)", e.Detail)
	}
	if e.Aborted {
		b.WriteString("; communicator aborted")
	}
	if errors.Is(e.Err, context.DeadlineExceeded) {
		b.WriteString("; a peer rank may be missing or stuck")
	}
	return b.String()
}

// Unwrap returns the NCCL result and, when a context ended the call, its error.
func (e *Error) Unwrap() []error {
	var out []error
	if e.Result != Success {
		out = append(out, e.Result)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// lastError returns ncclGetLastError's text for the calling thread.
func lastError() string {
	return strings.TrimSpace(ncclGetLastError())
}
