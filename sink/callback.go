package sink

import (
	"context"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// Received is a whole tensor as a Callback sees it.
type Received struct {
	Name  string
	DType dtype.DType
	Shape []int64
	// Data is valid only during the callback.
	Data []byte
}

// Callback returns a stages.Sink that calls fn once per tensor with its whole
// bytes. Tensors that fit in a bucket are passed as views of the bucket
// (no copy); tensors split across buckets are reassembled first. commit,
// when not nil, is called at the end of each round.
func Callback(fn func(ctx context.Context, t Received) error, commit func(ctx context.Context, version uint64) error) stages.Sink {
	return &callbackSink{fn: fn, commit: commit, partial: map[string][]byte{}}
}

type callbackSink struct {
	fn      func(context.Context, Received) error
	commit  func(context.Context, uint64) error
	partial map[string][]byte
}

func (c *callbackSink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if e.Whole() {
		return c.fn(ctx, Received{Name: e.Name, DType: e.DType, Shape: e.Shape, Data: data})
	}
	buf := c.partial[e.Name]
	if buf == nil {
		buf = make([]byte, e.Total)
		c.partial[e.Name] = buf
	}
	copy(buf[e.Chunk:], data)
	if !e.Complete() {
		return nil
	}
	delete(c.partial, e.Name)
	return c.fn(ctx, Received{Name: e.Name, DType: e.DType, Shape: e.Shape, Data: buf})
}

func (c *callbackSink) Commit(ctx context.Context, version uint64) error {
	if c.commit != nil {
		return c.commit(ctx, version)
	}
	return nil
}
