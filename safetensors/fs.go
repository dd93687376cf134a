package safetensors

import (
	"io"
	"io/fs"
	"os"
)

// FS is the file system that writers go through (WithFS): Create's Writer,
// CreateModel and WriteFileAtomic here, and the safetensors sink of package
// stages. OS, the default, is the operating system's. Another one can wrap
// it to inject what a real disk does on a bad day (a full disk, a failing
// fsync) where a test cannot make the disk do it.
type FS interface {
	// CreateTemp, MkdirAll, MkdirTemp, Rename, Remove and RemoveAll are
	// os's functions of the same names.
	CreateTemp(dir, pattern string) (FSFile, error)
	MkdirAll(path string, perm fs.FileMode) error
	MkdirTemp(dir, pattern string) (string, error)
	Rename(oldpath, newpath string) error
	Remove(name string) error
	RemoveAll(path string) error
	// Open opens a file or directory for reading (a directory to sync
	// it, after renames into it).
	Open(name string) (FSFile, error)
}

// FSFile is an open file of an FS; *os.File is one.
type FSFile interface {
	io.ReaderAt
	io.WriterAt
	io.Writer
	Name() string
	Chmod(mode fs.FileMode) error
	Truncate(size int64) error
	Sync() error
	Close() error
}

// OS is the operating system's file system, the FS writers use by default.
var OS FS = osFS{}

type osFS struct{}

func (osFS) CreateTemp(dir, pattern string) (FSFile, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return f, nil
}

func (osFS) Open(name string) (FSFile, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (osFS) MkdirAll(path string, perm fs.FileMode) error  { return os.MkdirAll(path, perm) }
func (osFS) MkdirTemp(dir, pattern string) (string, error) { return os.MkdirTemp(dir, pattern) }
func (osFS) Rename(oldpath, newpath string) error          { return os.Rename(oldpath, newpath) }
func (osFS) Remove(name string) error                      { return os.Remove(name) }
func (osFS) RemoveAll(path string) error                   { return os.RemoveAll(path) }

// WithFS makes Create, CreateModel and WriteFileAtomic write through fsys
// instead of OS. Readers (Open, OpenModel) always read the operating
// system's files.
func WithFS(fsys FS) Option { return func(o *options) { o.fs = fsys } }
