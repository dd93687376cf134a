//go:build linux

package source

import (
	"os"

	"golang.org/x/sys/unix"
)

// fadviseSupported reports whether fadviseWillNeed does anything here.
const fadviseSupported = true

// fadviseWillNeed asks the kernel to start reading [off, off+n) of f into
// the page cache (posix_fadvise POSIX_FADV_WILLNEED). It does not wait for
// the data.
func fadviseWillNeed(f *os.File, off, n int64) error {
	return fadvise(f, off, n, unix.FADV_WILLNEED)
}

// fadviseDontNeed asks the kernel to drop [off, off+n) of f from the page
// cache (clean pages only); n == 0 means to the end of the file.
func fadviseDontNeed(f *os.File, off, n int64) error {
	return fadvise(f, off, n, unix.FADV_DONTNEED)
}

func fadvise(f *os.File, off, n int64, advice int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = unix.Fadvise(int(fd), off, n, advice) }); err != nil {
		return err
	}
	if ferr != nil {
		return &os.PathError{Op: "fadvise", Path: f.Name(), Err: ferr}
	}
	return nil
}
