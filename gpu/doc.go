// Package gpu owns GPU memory and the copies to, from and within it: device
// memory through the CUDA driver API (loaded at run time, so the package
// builds and runs where no driver is installed), pinned host memory,
// streams, events and the kernels (PTX embedded in the binary). Its buffers
// and devices implement the interfaces of package mem, whose Host device
// serves machines without a GPU.
//
// # Devices and buffers
//
// mem.Host is ordinary Go memory. NewCUDADevice opens a GPU through its primary
// context; its Alloc returns device memory (DevicePtr set, Host nil).
// (*CUDADevice).AllocPinned, or the PinnedHost device, returns page-locked
// host memory from cuMemHostAlloc: Kind is KindHost and Host returns the
// bytes (a Go view of C memory made with unsafe.Slice), so host code takes it
// unchanged, while copies to and from the GPU run asynchronously at link
// speed. Whoever allocates a buffer frees it, after every copy that uses it
// has finished.
//
// # Streams, events and waits
//
// (*CUDADevice).NewStream queues asynchronous copies and memsets (CopyHtoD,
// CopyDtoH, CopyDtoD, Memset, and *Ptr variants for raw device addresses).
// Stream.Record returns an Event; Stream.WaitEvent orders one stream after
// another on the GPU. Stream.WaitValue and Stream.WriteValue order streams
// of different processes through a 32-bit word of device memory they all
// map (BenchmarkGatherLayoutTurns measures processes taking turns so);
// WaitValue64 waits on a 64-bit word, which RaiseValue64 (a one-thread
// atomic maximum) raises without ever lowering it, however late it lands.
// Stream.Sync and Event.Wait never block inside the
// driver: they poll (cuStreamQuery, cuEventQuery) with a short backoff and
// select on ctx.Done(), returning a *WaitError when the context ends first.
// Poll is that loop, for waits that combine several conditions.
//
// # Batched copies, views and fences
//
// CopyBatch collects many pointer-to-pointer copies (device addresses, or
// pinned host memory by Address) and Stream.CopyBatch queues them with one
// cuMemcpyBatchAsync call (CUDA 12.8+; the CUDA 13 _v2 ABI is preferred),
// falling back to a loop of cuMemcpyAsync inside one cgo call where the
// driver lacks it. (*CUDADevice).View wraps device memory allocated
// elsewhere (a framework's tensor) without owning it. WithFence marks a
// buffer as still being written by queued work: readers wait for its
// Fence event on their stream or on the host.
//
// # Timed events
//
// Stream.RecordTimed records an event that keeps the time the GPU reached
// it, and Elapsed returns the GPU time between two completed ones, so that
// work queued without waiting can still be timed: read after the work, off
// the path that queues it.
//
// # Staging and read-back
//
// A StagingRing (Stream.NewStagingRing) moves host bytes, from Go memory or
// read through a StagingSource such as a file, into device memory at pinned
// speed: reader goroutines fill a ring of pinned slots in parallel, each
// slot's copies are queued on the stream as soon as its reads land, and a
// slot is refilled only after its event. Its slots stay pinned until Close
// (pinning is slow). A Readback copies device memory back to pinned host
// memory of its own, after the buffer's fence. Both know nothing of what the
// bytes are.
//
// # Gather kernel
//
// Stream.NewGather returns a Gather, which queues many device-to-device
// copies with one launch of a small kernel (gather.ptx, PTX embedded in
// the binary and loaded with cuModuleLoadDataEx, launched with
// cuLaunchKernel): one thread block per piece (about 1/1024 of the bytes
// queued, from 64 KiB to GatherChunk), 16-byte loads and stores where the
// addresses allow. The copy
// engine costs microseconds per copy however copies are queued; the
// kernel's cost per copy is that of the bytes. The first Gather of a
// device loads the kernel and checks it on a few copies; where it cannot
// be loaded or fails that check (or WEIGHTCAST_GATHER=off), Gather falls
// back to CopyBatch and says why (Gather.Kernel, LastGatherPath).
//
// # Checksum kernel
//
// Stream.NewChecksummer returns a Checksummer, whose Queue adds a
// checksum of device memory to the stream (checksum.ptx: a grid-stride
// loop with 16-byte loads; each thread adds its partial sum with an atomic
// into one of 256 slots, which are copied to pinned memory) and returns a
// PendingSum; PendingSum.Wait adds the slots and finishes the sum with
// checksum.Finish, so the result equals checksum.Sum of the same bytes.
// Slots are pooled; many sums may be outstanding. Where the kernel cannot
// be loaded or fails its self-test (or WEIGHTCAST_GPU_CHECKSUM=off),
// NewChecksummer fails with an error matching ErrNoChecksumKernel.
//
// # Fused gather and checksum
//
// Gather.CopySum queues a Gather's copies and checksum.Sum of a buffer
// they write into (pack filling a bucket) or read out of (load copying a
// bucket into a model) in one pass (gather_sum.ptx): the kernel copies
// with the gather kernel's loops, hashes each word as it copies it, and
// each block adds its sum (reduced over the block by warp shuffles and
// shared memory) into a Checksummer's slots once; the bytes no copy moves
// (alignment padding, parts of the bucket filled otherwise) are read
// where they lie, so the result equals checksum.Sum of the buffer after
// the copies. It fuses copies of 64 KiB or more on average, whose sides
// in the buffer start on its 8-byte words and do not overlap; smaller
// copies cost less copied, then checksummed. Where the fused kernel
// cannot be loaded or fails its self-test (or WEIGHTCAST_GATHER_SUM=off),
// CopySum copies and then checksums: the same value, one pass more
// (Gather.SumKernel says which).
//
// # Layout checksums
//
// Gather.CopySumLayout sums a Layout: pieces of device memory, each read
// where it lies (scattered tensors of another process, mapped by IPC),
// placed at positions of a virtual buffer whose other bytes are zero; it
// copies the pieces that have a destination on the way, in the same pass
// (gather_layout.ptx: the fused kernel's loops with each range's position
// in the layout given, and zeros hashed without being read). The result
// equals checksum.Sum of the layout's bytes: a bucket's checksum when the
// pieces are what the bucket would hold and its padding is zero, without
// the bucket ever being filled, which is how a receiver that reads a
// sender's tensors in place checks them against a sum the sender computed
// itself. Where the kernel cannot be loaded or fails its self-test (or
// WEIGHTCAST_GATHER_LAYOUT=off), CopySumLayout copies and reads every
// piece back to the host to sum it there (Gather.LayoutKernel says why).
//
// # MAC kernels
//
// Stream.NewMACer returns a MACer, whose Queue adds keyed BLAKE3 (package
// mac) of device memory to the stream and returns a PendingMAC: one launch
// compresses every 1 KiB chunk in parallel, one thread each
// (mac_chunks.ptx), and launches of a parent kernel (mac_parents.ptx) join
// the chaining values a few tree levels at a time, in place, into the root,
// whose 32 bytes are copied to pinned memory; PendingMAC.Wait returns the
// value of mac.Sum. Where the kernels cannot be loaded or fail their
// self-test (or WEIGHTCAST_GPU_MAC=off), NewMACer fails with an error
// matching ErrNoMACKernel.
//
// Gather.CopyMACLayout computes the same MAC of a Layout whose pieces start
// on 1 KiB chunks (MACLayoutAlign), copying the pieces that have a
// destination on the way: the MAC of a bucket as pack would fill it, from
// the tensors where they lie. Where pieces are copied, mac_layout.ptx's
// blocks move their 128 chunks together, a 64-byte row of each at a time,
// four threads a chunk (whole sectors written), and hand each row to its
// compressing thread through shared memory: one thread writing its own
// chunk 64 bytes at a time, 1 KiB from its neighbours', ran at two thirds
// of this speed. Where they are only read, mac_layout_read.ptx's threads
// work alone, as mac_chunks.ptx's. The parent kernel then joins the chunks.
// Without the kernels (a nil MACer) the pieces are copied and read back to
// the host and the MAC computed there.
//
// Stream.NewPolyMACer returns a PolyMACer, whose Queue adds Poly1305-AES
// (mac.PolySum) of device memory to the stream: one launch of poly.ptx,
// whose threads evaluate Poly1305's polynomial over the 16-byte blocks a
// grid apart by Horner's rule with r raised to the grid's size (each block
// loaded two products before it is added, so that two loads of every thread
// are in flight while it multiplies), raise their values to their place
// with the key's table of powers (1 KiB of device memory per key), and add
// them limb by limb into a checksum slot, which the host finishes with the
// nonce's AES pad. Gather.CopyPolyLayout does the same over a Layout
// (poly_layout.ptx), as CopyMACLayout does with keyed BLAKE3, copying the
// pieces that have a destination on the way. Per 16-byte block the kernels
// run 25 multiply-adds and some 35 other instructions, where keyed BLAKE3
// runs about 200 additions, rotations and exclusive ors. The stages use
// them for the buckets of a sender given the Poly1305-AES bucket MAC
// (stages.SenderConfig.BucketMAC). Where they cannot be loaded or fail
// their self-tests (or WEIGHTCAST_GPU_POLY=off), NewPolyMACer fails with an
// error matching ErrNoPolyKernel, and those MACs are computed on the host.
//
// # Cast kernel
//
// Stream.NewCaster returns a Caster, which converts tensors in device
// memory between F32, BF16 and F16 (cast.ptx: one thread block per piece
// of at most CastChunk elements, groups of four elements per 8- or 16-byte
// access where the addresses allow) with integer arithmetic that
// reproduces package cast, PyTorch's CPU conversions, bit for bit,
// including its NaNs (the hardware's cvt.rn.bf16.f32 differs there).
// Add collects conversions, Flush launches them. Where the kernel cannot
// be loaded or fails its self-test (or WEIGHTCAST_GPU_CAST=off), Add fails
// with an error matching ErrNoCastKernel, and callers convert on the host.
//
// # Quantize kernel
//
// Stream.NewQuantizer returns a Quantizer, which quantizes F32, BF16 and
// F16 weights in device memory to block-scaled FP8 (quant.ptx: one thread
// block per 128×128 block; the block's amax reduced in shared memory, its
// scale by IEEE division; in full, aligned BF16 and F16 blocks the
// quotients from one reciprocal and a fused correction, correctly
// rounded, and the float8_e4m3fn codes from the hardware's
// cvt.rn.satfinite.e4m3x2, two at a time, whose saturation never acts on
// a block's quotients; elsewhere division and integer rounding) and
// reproduces package quant bit for bit, NaN and infinity blocks,
// subnormals and ties included. Queue launches one job: the codes of a
// range of the weight's elements (a chunk of a bucket) and the scales of
// every block it touches. Where quant.ptx cannot be loaded or fails its
// self-test, the Quantizer uses quant_int.ptx (its vector path by integer
// rounding, as before the converter; Converter says so and why); where
// that fails too (or WEIGHTCAST_GPU_QUANT=off), Queue fails with an error
// matching ErrNoQuantKernel.
//
// # Testing kernels without a GPU
//
// The package's tests run every kernel on the host through a small PTX
// interpreter (ptx_interp_test.go), which checks register classes, operand
// widths, labels, memory bounds and alignment as it goes, and runs warp
// shuffles and block barriers as the GPU would or refuses them where they
// would hang or be undefined (divergent lanes). The kernels with
// long unrolled or repeated code (the MAC kernels, the two gather
// kernels, the two quantize kernels, the Poly1305 kernels) are
// generated by Go in the tests (ptx_gen_test.go); `go generate ./gpu`
// rewrites their PTX, and a test fails when it is stale. TestFakeDriver
// runs the entry points, the gather kernel's launches included, against a
// stand-in libcuda.so.1 built from C that keeps device memory on the host
// and refuses wrong handles and arguments (gputest.RunWithFakes), so the
// cgo layer is checked without a GPU too.
//
// # IPC
//
// (*CUDADevice).ExportIPC gives a 64-byte IPCHandle for a device buffer;
// another process on the host opens it with OpenIPC, and the opened buffer's
// Free unmaps it. Memory some other code allocated (a PyTorch tensor) is
// exported by address: Allocation finds the allocation that holds an
// address (cuMemGetAddressRange) and its unique id (a new allocation where
// a freed one was has another: what a cache of handles keys on),
// ExportAddress exports it, and memory CUDA
// IPC cannot share (PyTorch's expandable segments, stream-ordered pools) is
// refused with ErrNotExportable. UUID tells processes whether they share a
// GPU, whatever their CUDA_VISIBLE_DEVICES.
//
// # Loading the driver
//
// libcuda.so.1 is opened with dlopen by OpenCUDA (called by every entry
// point) through a small cgo shim with a hand-written header (cuda_shim.h):
// a dispatch table of function pointers filled by dlsym (both through
// internal/dl, the dynamic-library layer shared with nccl), each call going
// through a static inline function that answers "function not found" for a
// missing symbol. Using a GPU needs a program built with cgo (a C compiler)
// but no CUDA toolkit. Where the library is absent the entry points return
// an error matching ErrNoDriver; CUDAResult names driver status codes from
// a built-in table.
//
// Every C call sits in one file, driver_cgo.go: small Go functions named
// after the driver calls, with Go types (handles as integers, device
// addresses as uint64, host memory as []byte). The rest of the package is
// pure Go. Built without cgo (CGO_ENABLED=0), the package still compiles,
// with driver_nocgo.go in that file's place: OpenCUDA then fails with an
// error matching both ErrNoCgo and ErrNoDriver, so the same code runs on
// host memory as on a machine without a GPU.
//
// The CUDA current context is per OS thread. Each shim call makes the
// device's primary context current on its thread before the driver call, so
// any goroutine may use any device. For libraries that read the current
// context themselves (NCCL), (*CUDADevice).LockContext pins the goroutine to
// a thread with the context current.
package gpu
