// Package gputest holds the setup that GPU tests share: opening a CUDA
// device or skipping the test, saying why, where there is none; streams and
// buffers that are closed and freed when the test ends; bounded stream
// synchronization; uploads of random bytes; the GPU memory that the
// transport conformance suite runs ipc and nccl on (CUDAMemory); OnDevice,
// the body of a child rank on a GPU (the child-process plumbing itself is
// package transporttest's, which has no cgo); and RunWithFakes, which runs
// a test in a child process against stand-ins for libcuda.so.1 and
// libnccl.so.2 built from C (testdata/), to check the cgo layers of gpu and
// nccl where there is no GPU.
//
// Every helper that touches the GPU skips or fails the test through its
// testing.TB, so a test reads as its steps. Package gpu's own tests cannot
// use it (gputest imports gpu); every other package's tests can, as long as
// gputest imports nothing above gpu and transport (stages' own tests use
// it, so it must never import stages).
package gputest
