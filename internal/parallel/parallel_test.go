package parallel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPieces checks that the pieces cover [0, total) exactly once, each at
// most Piece bytes and starting on a multiple of it, below and above
// MinBytes.
func TestPieces(t *testing.T) {
	for _, total := range []int64{0, 1, Piece - 1, Piece, Piece + 1, MinBytes - 1, MinBytes, MinBytes + 7, 10*Piece + 3} {
		var mu sync.Mutex
		seen := map[int64]int64{}
		err := Pieces(context.Background(), total, func(off, n int64) error {
			mu.Lock()
			defer mu.Unlock()
			if _, dup := seen[off]; dup {
				return fmt.Errorf("piece at %d twice", off)
			}
			seen[off] = n
			return nil
		})
		if err != nil {
			t.Fatalf("total %d: %v", total, err)
		}
		var covered int64
		for off, n := range seen {
			if off%Piece != 0 || n <= 0 || n > Piece || off+n > total {
				t.Fatalf("total %d: piece [%d, %d)", total, off, off+n)
			}
			if off+n < total && n != Piece {
				t.Fatalf("total %d: inner piece at %d of %d bytes", total, off, n)
			}
			covered += n
		}
		if covered != total {
			t.Fatalf("total %d: pieces cover %d bytes", total, covered)
		}
	}
}

// TestPiecesError: the error of the lowest failed piece comes back, and
// pieces after a failure are skipped.
func TestPiecesError(t *testing.T) {
	const total = 64 * Piece
	var mu sync.Mutex
	calls := 0
	err := Pieces(context.Background(), total, func(off, n int64) error {
		mu.Lock()
		calls++
		mu.Unlock()
		if off >= 5*Piece {
			return fmt.Errorf("piece %d failed", off/Piece)
		}
		return nil
	})
	if err == nil {
		t.Fatal("no error")
	}
	var first int
	if _, serr := fmt.Sscanf(err.Error(), "piece %d failed", &first); serr != nil || first < 5 {
		t.Fatalf("error %v", err)
	}
	if calls == 64 {
		t.Logf("every piece ran (possible on a busy machine, but unlikely): %v", err)
	}
	// A single goroutine's failure stops the loop at once.
	want := errors.New("boom")
	if err := Pieces(context.Background(), 3*Piece, func(off, n int64) error { return want }); !errors.Is(err, want) {
		t.Fatalf("small total: %v", err)
	}
}

// TestPiecesCancel: pieces not yet started when ctx ends are skipped, and
// the error is ctx's.
func TestPiecesCancel(t *testing.T) {
	for _, total := range []int64{3 * Piece, 64 * Piece} {
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		calls := 0
		err := Pieces(ctx, total, func(off, n int64) error {
			mu.Lock()
			calls++
			mu.Unlock()
			cancel()
			return nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("total %d: %v, want context.Canceled", total, err)
		}
		if max := int64(runtime.GOMAXPROCS(0)); int64(calls) > max || calls == int(total/Piece) {
			t.Fatalf("total %d: %d pieces ran after the cancel", total, calls)
		}
	}
}

// TestCopy copies random buffers of sizes around the thresholds.
func TestCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 5, MinBytes - 3, MinBytes + 3, 3*MinBytes + 11} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		dst := make([]byte, n+10)
		if got := Copy(dst, src); got != n {
			t.Fatalf("copied %d of %d", got, n)
		}
		if !bytes.Equal(dst[:n], src) || !bytes.Equal(dst[n:], make([]byte, 10)) {
			t.Fatalf("%d bytes: wrong copy", n)
		}
	}
}

func BenchmarkCopy256MiB(b *testing.B) {
	src, dst := make([]byte, 256<<20), make([]byte, 256<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			copy(dst, src)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			Copy(dst, src)
		}
	})
}
