//go:build !linux

package main

import "syscall"

// childProcAttr puts a rank process in a process group of its own, so that
// a terminal's Ctrl-C reaches only the launcher, which stops the ranks
// itself. Without Linux's Pdeathsig a rank notices its launcher is gone
// from its standard input alone.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
