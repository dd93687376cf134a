package main

import "syscall"

// childProcAttr puts a rank process in a process group of its own, so that
// a terminal's Ctrl-C reaches only the launcher, which stops the ranks
// itself, and has the kernel send it SIGTERM when the launcher dies.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
