//go:build !linux

package source

import (
	"errors"
	"os"
)

// fadviseSupported reports whether fadviseWillNeed does anything here.
const fadviseSupported = false

var errNoFadvise = errors.New("posix_fadvise is only used on Linux")

func fadviseWillNeed(f *os.File, off, n int64) error { return errNoFadvise }

func fadviseDontNeed(f *os.File, off, n int64) error { return errNoFadvise }
