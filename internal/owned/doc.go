// Package owned makes temporary directories that record the process that
// owns them, and removes the ones whose owner is gone: what a process killed
// with SIGKILL (or by the OOM killer) left behind, since it could not remove
// its own.
//
// MkdirTemp writes a small owner file into each directory it makes: the
// owner's pid, its start time (so a recycled pid is not taken for the
// owner) and its pid namespace (so a process in another namespace, which
// sees other pids, never judges it). Sweep removes the directories whose
// owner has ended and leaves alone every directory it cannot judge: no
// owner file, an unreadable one, another pid namespace, another user's.
package owned
