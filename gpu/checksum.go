package gpu

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/mem"
)

// checksumPTX is the checksum kernel, hand-written PTX with its CUDA C in
// a comment at the top of the file.
//
//go:embed checksum.ptx
var checksumPTX string

const (
	// checksumSlots is the number of partial sums a launch adds into:
	// thread g adds its sum into partial g % 256, so the threads of a warp
	// add into distinct addresses. A slot holds the partials at its start,
	// then the launches' ticket (checksumTicket, a uint32), then the 256
	// words of the result (checksumResult) that the host reads back and
	// adds: the launch's last block to finish moves the partials there and
	// clears them and the ticket (sum_finish in checksum.ptx), so a slot
	// needs no clearing between sums.
	checksumSlots     = 256
	checksumSlotBytes = checksumSlots * 8
	checksumTicket    = checksumSlotBytes
	checksumResult    = checksumTicket + 16
	// checksumThreads is the kernel's block size.
	checksumThreads = 256
	// checksumBytesPerThread: a launch uses one more block for every
	// checksumThreads × this many bytes, so small buffers take few blocks.
	checksumBytesPerThread = 256
	// checksumBlocksPerSM caps the grid at this many blocks per
	// multiprocessor: 8 blocks of 256 threads fill an H200's
	// multiprocessor (the kernel uses 26 registers; BenchmarkChecksum1GiB,
	// docs/benchmarks.md).
	checksumBlocksPerSM = 8
	// checksumCheckWait bounds the self-test that runs when the kernel is
	// loaded.
	checksumCheckWait = 10 * time.Second
)

// ChecksumEnv names the environment variable that turns the checksum
// kernel off when set to "off": NewChecksummer then fails with
// ErrNoChecksumKernel, and callers checksum on the host.
const ChecksumEnv = "WEIGHTCAST_GPU_CHECKSUM"

// ErrNoChecksumKernel is matched (errors.Is) by the error NewChecksummer
// returns when the checksum kernel cannot be used: the driver lacks a
// function, the PTX did not compile for this GPU, the kernel failed its
// self-test, or ChecksumEnv turned it off. The error says which.
var ErrNoChecksumKernel = errors.New("gpu: checksum kernel unavailable")

// ErrChecksummerClosed is matched (errors.Is) by the errors of a
// Checksummer, or of a PendingSum not yet waited for, used after the
// Checksummer's Close.
var ErrChecksummerClosed = errors.New("gpu: checksummer closed")

// checksumKernel loads the checksum kernel into d's context once, and
// checks it before anything else may use it.
func (d *CUDADevice) checksumKernel() (*loadedKernel, error) {
	return d.kernels.checksum.get(d.loadChecksum)
}

func (d *CUDADevice) loadChecksum() (*loadedKernel, error) {
	if v := os.Getenv(ChecksumEnv); v == "off" {
		return nil, fmt.Errorf("%w: %s=%s", ErrNoChecksumKernel, ChecksumEnv, v)
	}
	if _, err := d.Multiprocessors(); err != nil {
		return nil, fmt.Errorf("%w on %s: %w", ErrNoChecksumKernel, d.Name(), err)
	}
	k, err := d.loadPTX("checksum.ptx", checksumPTX, "wc_checksum", ErrNoChecksumKernel)
	if err != nil {
		return nil, err
	}
	return d.selfTested(k, d.checkChecksum(k), ErrNoChecksumKernel)
}

// checksumCheck lists the self-test's sums: (offset, length) in a buffer
// of checksumCheckSize bytes, at 16-byte aligned, 8-byte aligned and
// unaligned addresses, with partial last words and odd last words, small
// and over a megabyte (many blocks).
const checksumCheckSize = 1<<20 + 64

var checksumCheck = []struct{ off, n int }{
	{0, 0}, {0, 1}, {0, 7}, {0, 8}, {0, 9}, {0, 15}, {0, 16}, {0, 17},
	{8, 1}, {8, 9}, {8, 17}, {8, 24}, {3, 1}, {3, 17}, {5, 1000},
	{0, 4096}, {0, 1<<20 + 13}, {8, 1<<20 + 5}, {1, 1<<20 + 7}, {16, 1<<20 + 24},
}

// checkChecksum runs the kernel on checksumCheck, all sums outstanding at
// once, and compares each with checksum.Sum.
func (d *CUDADevice) checkChecksum(k *loadedKernel) error {
	return selfTest(d, checksumCheckWait, []int{checksumCheckSize},
		func(s *Stream) *Checksummer { return newChecksummer(s, k) },
		runChecksumCheck)
}

// runChecksumCheck queues checksumCheck's sums of bufs[0], which it fills
// with a pattern, on c, and compares each with checksum.Sum.
func runChecksumCheck(ctx context.Context, s *Stream, c *Checksummer, bufs []mem.Buffer) error {
	d, buf := s.d, bufs[0]
	pat := make([]byte, checksumCheckSize)
	for i := range pat {
		pat[i] = byte(i*151 + i>>9 + 11)
	}
	if err := s.CopyHtoD(buf, 0, pat); err != nil {
		return err
	}
	sums := make([]*PendingSum, len(checksumCheck))
	for i, cc := range checksumCheck {
		v, err := d.View(buf.DevicePtr()+uint64(cc.off), cc.n)
		if err != nil {
			return err
		}
		if sums[i], err = c.Queue(v, int64(cc.n)); err != nil {
			return err
		}
	}
	for i, cc := range checksumCheck {
		got, err := sums[i].Wait(ctx)
		if err != nil {
			return err
		}
		sums[i].Close()
		if want := checksum.Sum(pat[cc.off : cc.off+cc.n]); got != want {
			return fmt.Errorf("the checksum of %d bytes at offset %d is %#x, want %#x", cc.n, cc.off, got, want)
		}
	}
	return nil
}

// checksumBlocks returns the grid size for a checksum of n bytes: one
// block per checksumThreads×checksumBytesPerThread bytes, at least one,
// at most most.
func checksumBlocks(n int64, most int) int {
	per := int64(checksumThreads * checksumBytesPerThread)
	b := (n + per - 1) / per
	return int(max(1, min(b, int64(most))))
}

// Checksummer computes checksum.Sum of device memory on a stream: Queue
// adds a launch of the checksum kernel to the stream and returns a
// PendingSum, whose Wait returns the checksum once the launch is done. The
// kernel reads the memory once, at close to the device's memory bandwidth,
// and sends 2 KiB of sums to the host.
//
// Each PendingSum holds a slot: 4 KiB of device memory for the kernel's
// partial sums and its result (the kernel leaves the partials cleared for
// the slot's next sum, so no memset precedes a launch), pinned host memory
// the 2 KiB of result are copied into, and an event. Slots are pooled and
// reused; the pool grows while many sums are outstanding. A slot goes back
// to the pool only when its launch and copy are known finished, so memory
// a kernel may still write is never reused.
//
// A Checksummer is for one goroutine at a time (Queue and Close). Its
// PendingSums may be waited for and closed on other goroutines, each
// PendingSum by one goroutine at a time. Close the Checksummer before
// closing its stream.
type Checksummer struct {
	s      *Stream
	k      *loadedKernel
	blocks int // grid size cap; 0 until first use
	slots  resultSlots
}

// newChecksummer returns a Checksummer of s with the loaded kernel k.
func newChecksummer(s *Stream, k *loadedKernel) *Checksummer {
	return &Checksummer{s: s, k: k, slots: resultSlots{s: s, name: "checksum", words: checksumSlots, scratch: checksumResult / 8, closedErr: ErrChecksummerClosed}}
}

// NewChecksummer returns a Checksummer that queues sums on s. The first
// one of a device loads the kernel (the driver compiles its PTX) and
// checks it against checksum.Sum on sums of 0 to 1 MiB + 13 bytes at
// several alignments; the error wraps ErrNoChecksumKernel when that fails,
// the driver lacks a function, or ChecksumEnv is "off", and says why.
func (s *Stream) NewChecksummer() (*Checksummer, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	k, err := s.d.checksumKernel()
	if err != nil {
		return nil, err
	}
	return newChecksummer(s, k), nil
}

// PendingSum is a checksum queued on a stream (Checksummer.Queue).
type PendingSum struct{ pendingResult[uint64] }

// Queue queues a checksum of the first n bytes of buf on the stream, after
// everything queued on it before (and, if buf carries a fence, after the
// fence: see WithFence): the kernel, which leaves its sum in a slot, and
// a copy of the slot to pinned memory, then an event. It never
// blocks. buf must be device memory of the stream's device (an
// allocation, a View, an IPC mapping) and n at most buf.Len(). The bytes
// must stay unchanged until the PendingSum's Wait has returned.
func (c *Checksummer) Queue(buf mem.Buffer, n int64) (*PendingSum, error) {
	p, err := c.check(buf, n, "checksum")
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return &PendingSum{knownResult(checksum.Finish(0, 0), 0)}, nil
	}
	if ev := FenceOf(buf); ev != nil {
		if err := c.s.WaitEvent(ev); err != nil {
			return nil, err
		}
	}
	blocks, err := c.gridCap()
	if err != nil {
		return nil, err
	}
	return c.queue(n, func(sl *sumSlot) error {
		blocks := checksumBlocks(n, blocks)
		slots, first := sl.next()
		// wc_checksum(buf, n, slots, first) on a grid of blocks × checksumThreads.
		if r := cuLaunchKernel(c.s.d.ctx, c.k.fn, uint32(blocks), checksumThreads, c.s.s, p, uint64(n), slots, first); r != 0 {
			return c.s.d.err("cuLaunchKernel", fmt.Sprintf("checksum kernel over %d bytes, %d blocks", n, blocks), r)
		}
		return nil
	})
}

// check checks that c may queue work reading the first n bytes of buf
// (what names the work in errors), and returns their device address.
func (c *Checksummer) check(buf mem.Buffer, n int64, what string) (uint64, error) {
	if err := c.s.check(); err != nil {
		return 0, err
	}
	if c.slots.closed {
		return 0, fmt.Errorf("%w: Queue on cuda:%d", ErrChecksummerClosed, c.s.d.ordinal)
	}
	return deviceBytes(c.s.d, buf, n, what, "checksum host memory with checksum.Sum")
}

// gridCap returns the most blocks a checksum launch uses on c's device.
func (c *Checksummer) gridCap() (int, error) {
	if c.blocks == 0 {
		sms, err := c.s.d.Multiprocessors()
		if err != nil {
			return 0, err
		}
		c.blocks = max(1, sms*checksumBlocksPerSM)
	}
	return c.blocks, nil
}

// queue queues the sum of n bytes into a slot on the stream: kernels,
// whose launches add the bytes' word contributions into the slot (each
// launch's parameters from sumSlot.next), then the copy of the slot's
// result to pinned memory and the event. The result of kernels that
// launched nothing is zero.
func (c *Checksummer) queue(n int64, kernels func(sl *sumSlot) error) (*PendingSum, error) {
	sl, err := c.slots.queue(func(rs *resultSlot) error {
		sl := sumSlot{dev: rs.dev}
		if err := kernels(&sl); err != nil || sl.launched {
			return err
		}
		if r := cuMemsetD8Async(c.s.d.ctx, rs.dev+checksumResult, 0, checksumSlotBytes, c.s.s); r != 0 {
			return c.s.d.err("cuMemsetD8Async", "the result of a sum of no launch", r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &PendingSum{queuedResult[uint64](&c.slots, sl, n)}, nil
}

// sumSlot is the slot that the launches of one sum add into.
type sumSlot struct {
	dev      uint64
	launched bool
}

// next returns the parameters slots and first of the sum's next launch:
// the slot's device address, and 1 for the first launch (which sets the
// result rather than adding to it), else 0.
func (s *sumSlot) next() (slots, first uint64) {
	first = 1
	if s.launched {
		first = 0
	}
	s.launched = true
	return s.dev, first
}

// Wait waits until the sum's launch has finished, at most until ctx ends
// (then it returns a *WaitError and the sum stays pending), and returns
// the checksum: checksum.Finish of the sum of the slots. Calling it again
// returns the same value.
func (p *PendingSum) Wait(ctx context.Context) (uint64, error) {
	return p.wait(ctx, func(host []uint64) uint64 {
		var sum uint64
		for _, v := range host {
			sum += v
		}
		return checksum.Finish(sum, p.n)
	})
}

// Close gives the sum's slot back to the Checksummer: at once after a
// successful Wait, else once its launch is known finished. Wait still
// returns a value it returned before. Close is idempotent.
func (p *PendingSum) Close() { p.close() }

// Close waits, bounded by ctx, until no launch of the Checksummer may
// still write its slots, then frees them. PendingSums not yet waited for
// then fail with ErrChecksummerClosed; values already returned by Wait
// stay available. If the wait fails, the memory stays allocated (rather
// than be freed under a running kernel), Queue refuses, and Close returns
// the error; calling it again retries. Close is idempotent.
func (c *Checksummer) Close(ctx context.Context) error { return c.slots.close(ctx, "checksummer") }
