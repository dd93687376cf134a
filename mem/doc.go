// Package mem says where bucket bytes live: the Buffer and Device
// interfaces that every pipeline stage and transport takes, and Host, the
// Device of ordinary Go memory.
//
// It is pure Go with no dependencies, so everything that only moves host
// memory (the tcp and in-process transports, the metadata bus, the host
// stages) builds and runs with CGO_ENABLED=0. GPU memory, pinned host
// memory and the copies between them are package gpu's, which implements
// these interfaces.
package mem
