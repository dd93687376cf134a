//go:build !cgo

package dl

import "unsafe"

// The loader of a program built without cgo (see doc.go): nothing can be
// opened, so open fails with ErrNoCgo, and the other functions, never
// reached without a handle, answer as for a missing symbol. The signatures
// are dl_cgo.go's; `CGO_ENABLED=0 go build` checks that they still match.

func open(string) (h uintptr, msg string, err error) { return 0, "", ErrNoCgo }

func symbol(uintptr, string) (unsafe.Pointer, string) { return nil, ErrNoCgo.Error() }

func path(uintptr) string { return "" }

func closeLib(uintptr) string { return "" }
