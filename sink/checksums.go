package sink

import (
	"context"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/wire"
)

// Checksums is a stages.Sink that keeps only a checksum.Sum of every
// tensor, for comparing ranks without holding the model.
type Checksums struct {
	open    map[string]*checksum.Digest
	Sums    map[string]uint64
	Bytes   int64
	Version uint64
}

// NewChecksums returns an empty Checksums.
func NewChecksums() *Checksums {
	return &Checksums{open: map[string]*checksum.Digest{}, Sums: map[string]uint64{}}
}

// Load adds the entry's bytes to its tensor's checksum.
func (c *Checksums) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if e.Whole() {
		c.Sums[e.Name] = checksum.Sum(data)
	} else {
		d := c.open[e.Name]
		if d == nil {
			d = new(checksum.Digest)
			c.open[e.Name] = d
		}
		d.Write(data)
		if e.Complete() {
			c.Sums[e.Name] = d.Sum64()
			delete(c.open, e.Name)
		}
	}
	c.Bytes += int64(len(data))
	return nil
}

// Commit records the version.
func (c *Checksums) Commit(ctx context.Context, version uint64) error {
	c.Version = version
	return nil
}
