//go:build cgo

// nccl_shim.c holds the dispatch table declared in nccl_shim.h, which
// openLibrary (library_cgo.go) fills through package internal/dl. It is
// compiled only with cgo (the build constraint above): without it the
// package's Go twin, library_nocgo.go, stands in.
#include "nccl_shim.h"

wc_nccl_table wc_nccl;
