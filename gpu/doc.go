// Package gpu owns memory that bucket buffers live in and the copies between
// it: device memory through the CUDA driver API (loaded at run time, so the
// package builds and runs where no driver is installed) and plain host memory
// behind the same Device and Buffer interfaces, so that every pipeline also
// runs on machines without a GPU.
package gpu
