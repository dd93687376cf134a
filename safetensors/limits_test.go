package safetensors

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

// TestMetadataLimit: a valid file whose __metadata__ is larger than
// MaxMetadataBytes is refused at open, with an error that names the file,
// the metadata's size and the limit, before its strings are decoded; at
// the limit it opens.
func TestMetadataLimit(t *testing.T) {
	const tensor = `"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}`
	withMeta := func(value string) string { return `{"__metadata__":{"notes":"` + value + `"},` + tensor + `}` }
	objLen := func(value string) int64 { return int64(len(`{"notes":""}`) + len(value)) }

	small := strings.Repeat("x", 100)
	lim := Limits{MaxMetadataBytes: objLen(small)}
	f, err := Open(rawFile(t, withMeta(small), []byte{1, 2}), WithLimits(lim))
	if err != nil {
		t.Fatalf("metadata at the limit: %v", err)
	}
	f.Close()
	p := rawFile(t, withMeta(small+"x"), []byte{1, 2})
	_, err = Open(p, WithLimits(lim))
	want := fmt.Sprintf("%s: limit exceeded: __metadata__ is %d bytes, more than the limit of %d (Limits.MaxMetadataBytes)", p, objLen(small)+1, lim.MaxMetadataBytes)
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "remove its large values") {
		t.Fatalf("metadata over the limit: want an ErrLimit saying %q and what to do, got %v", want, err)
	}

	// The default limit, with a file far over it: refused without
	// decoding the metadata (the header itself is read once).
	huge := strings.Repeat("y", DefaultMaxMetadataBytes+(4<<20))
	p = rawFile(t, withMeta(huge), []byte{1, 2})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = Open(p)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), fmt.Sprintf("__metadata__ is %d bytes", objLen(huge))) {
		t.Fatalf("huge metadata: want ErrLimit naming its size, got %.300v", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(len(huge))*3/2 {
		t.Errorf("refusing a %d-byte header allocated %d bytes: the metadata was decoded", len(huge), alloc)
	}
}

// TestCreateMetadataLimit: Create refuses metadata it could not read back.
func TestCreateMetadataLimit(t *testing.T) {
	dir := t.TempDir()
	meta := map[string]string{"notes": strings.Repeat("z", 64)}
	_, err := Create(filepath.Join(dir, "m.safetensors"), []TensorInfo{{Name: "a", DType: dtype.U8, Shape: []int64{2}}}, meta, WithLimits(Limits{MaxMetadataBytes: 32}))
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "Limits.MaxMetadataBytes") {
		t.Fatalf("want ErrLimit, got %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
		t.Fatalf("Create left %v behind", m)
	}
}
