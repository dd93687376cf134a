package safetensors_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/safetensors"
)

// Write a file, then read it back tensor by tensor.
func Example() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "model.safetensors")

	w, err := safetensors.Create(path, []safetensors.TensorInfo{
		{Name: "embed.weight", DType: dtype.BF16, Shape: []int64{2, 2}},
		{Name: "norm.weight", DType: dtype.F32, Shape: []int64{2}},
	}, map[string]string{"format": "pt"})
	if err != nil {
		log.Fatal(err)
	}
	// Bytes may arrive in any order and in chunks.
	if err := w.WriteTensorAt("norm.weight", []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40}, 0); err != nil {
		log.Fatal(err)
	}
	if err := w.WriteTensorAt("embed.weight", []byte{1, 2, 3, 4, 5, 6, 7, 8}, 0); err != nil {
		log.Fatal(err)
	}
	if err := w.Close(); err != nil { // checks every byte was written
		log.Fatal(err)
	}

	f, err := safetensors.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	fmt.Println("metadata:", f.Metadata())
	for _, t := range f.Tensors() {
		b := make([]byte, t.Size)
		if err := f.ReadTensor(t.Name, b); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s %s %v at %d: %v\n", t.Name, t.DType, t.Shape, t.Offset, b)
	}
	// Output:
	// metadata: map[format:pt]
	// embed.weight BF16 [2 2] at 176: [1 2 3 4 5 6 7 8]
	// norm.weight F32 [2] at 184: [0 0 128 63 0 0 0 64]
}

// Copy a checkpoint (one file or a sharded directory) so that the copy is
// byte-identical: same shard names, tensor order, metadata and index.
func ExampleCreateModel() {
	src, err := safetensors.OpenModel("testdata/reference/sharded_transformers")
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	w, err := safetensors.CreateModel(dir, src.Layout())
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range src.Tensors() {
		r, err := src.Section(t.Name)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := w.CopyTensor(context.Background(), t.Name, r); err != nil {
			log.Fatal(err)
		}
	}
	if err := w.Close(); err != nil { // the shards, then the index
		log.Fatal(err)
	}
	fmt.Println(len(src.Shards()), "shards,", src.Len(), "tensors")
	// Output: 5 shards, 16 tensors
}
