package parallel

import (
	"context"
	"runtime"
	"sync"
)

// MinBytes is the size below which Pieces and Copy run on the calling
// goroutine: under it, starting goroutines costs more than it saves.
const MinBytes = 8 << 20

// Piece is the most bytes one goroutine handles at a time.
const Piece = 2 << 20

// Pieces calls fn for consecutive pieces [off, off+n) of [0, total), each
// at most Piece bytes and starting at a multiple of Piece (so pieces keep
// any alignment up to Piece), on up to GOMAXPROCS goroutines (the calling
// one alone when total is below MinBytes). It returns when every call has
// returned, with the error of the lowest failed piece, or ctx's error;
// once a piece has failed or ctx is done, pieces not yet started are
// skipped.
func Pieces(ctx context.Context, total int64, fn func(off, n int64) error) error {
	if total <= 0 {
		return nil
	}
	workers := int64(runtime.GOMAXPROCS(0))
	if total < MinBytes || workers < 2 {
		for off := int64(0); off < total; off += Piece {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(off, min(Piece, total-off)); err != nil {
				return err
			}
		}
		return nil
	}
	count := (total + Piece - 1) / Piece
	workers = min(workers, count)
	var (
		mu      sync.Mutex
		next    int64 // the next piece to start
		failed  = int64(-1)
		failure error
		wg      sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				if i >= count || failed >= 0 {
					mu.Unlock()
					return
				}
				if err := ctx.Err(); err != nil {
					failed, failure = i, err
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				off := i * Piece
				if err := fn(off, min(Piece, total-off)); err != nil {
					mu.Lock()
					if failed < 0 || i < failed {
						failed, failure = i, err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return failure
}

// Copy copies src into dst as the built-in copy does (min(len(dst),
// len(src)) bytes; they must not overlap), on several goroutines when the
// copy is large, and returns the number of bytes copied.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	Pieces(context.Background(), int64(n), func(off, k int64) error {
		copy(dst[off:off+k], src[off:off+k])
		return nil
	})
	return n
}
