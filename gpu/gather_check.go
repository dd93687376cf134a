package gpu

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/mem"
)

// The self-tests of the fused gather and checksum kernel (gather_sum.go)
// and of the layout kernel (gather_layout.go) share one shape: copies
// between two device buffers filled with patterns, a checksum taken as
// they run, and both the sum and the bytes written compared with what the
// host computes. checkSummingGather is that shape; each kernel's file
// keeps only its cases and how it queues one. The buffers are
// gatherCheckSize bytes, as the plain gather kernel's self-test's.

// gatherSumTest is what the fused and layout kernels' self-tests run on:
// a Gather and a Checksummer of one stream.
type gatherSumTest struct {
	g *Gather
	c *Checksummer
}

// Close closes the Gather and the Checksummer.
func (t gatherSumTest) Close(ctx context.Context) error {
	return errors.Join(t.g.Close(ctx), t.c.Close(ctx))
}

// gatherCase queues case ci of a self-test on t: copies between bufs[0]
// and bufs[1], whose contents host holds, with a checksum. It applies the
// copies to host as the GPU will apply them to bufs, and returns the
// pending sum, the host bytes it must equal the checksum of, and which
// buffer (0 or 1) the copies write.
type gatherCase func(ctx context.Context, t gatherSumTest, bufs []mem.Buffer, ci int, host [2][]byte) (
	ps *PendingSum, summed []byte, written int, err error)

// checkSummingGather runs the self-test of a gather kernel that sums as it
// copies: cases cases, bounded by wait, on a Gather that gather makes on
// the test's stream. For each case it fills both buffers with patterns,
// queues the case (queue), and compares the sum with checksum.Sum of the
// summed bytes and the written buffer with its host copy. what names the
// checksum in errors.
func (d *CUDADevice) checkSummingGather(wait time.Duration, gather func(s *Stream) *Gather, what string, cases int,
	queue gatherCase) error {
	return selfTest(d, wait, []int{gatherCheckSize, gatherCheckSize},
		func(s *Stream) gatherSumTest { return gatherSumTest{gather(s), newChecksummer(s, nil)} },
		func(ctx context.Context, s *Stream, t gatherSumTest, bufs []mem.Buffer) error {
			for ci := range cases {
				if err := runGatherCase(ctx, s, t, bufs, ci, what, queue); err != nil {
					return err
				}
			}
			return nil
		})
}

// runGatherCase runs case ci of checkSummingGather.
func runGatherCase(ctx context.Context, s *Stream, t gatherSumTest, bufs []mem.Buffer, ci int, what string,
	queue gatherCase) error {
	host := [2][]byte{make([]byte, gatherCheckSize), make([]byte, gatherCheckSize)}
	for i := range gatherCheckSize {
		host[0][i], host[1][i] = byte(i*131+ci), byte(i*17+i>>8+ci)
	}
	for i, h := range host {
		if err := s.CopyHtoD(bufs[i], 0, h); err != nil {
			return err
		}
	}
	ps, summed, written, err := queue(ctx, t, bufs, ci, host)
	if err != nil {
		return err
	}
	sum, err := ps.Wait(ctx)
	ps.Close()
	if err != nil {
		return err
	}
	if w := checksum.Sum(summed); sum != w {
		return fmt.Errorf("case %d: the %s checksum of %d bytes is %#x, want %#x", ci, what, len(summed), sum, w)
	}
	got := make([]byte, gatherCheckSize)
	if err := s.CopyDtoH(got, bufs[written], 0); err != nil {
		return err
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	if i := diffAt(got, host[written]); i >= 0 {
		return fmt.Errorf("case %d: byte %d of the destination is %#x, want %#x", ci, i, got[i], host[written][i])
	}
	return nil
}
