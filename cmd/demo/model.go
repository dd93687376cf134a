package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// model is what a round sends: a Source whose tensors can be listed and
// looked up (to verify them) and whose size is known.
type model interface {
	stages.Source
	stages.Lookuper
	List() []*stages.Tensor
	Size() int64
}

var (
	checkpointOnce sync.Once
	checkpoint     model
	checkpointErr  error
)

// model is the model of a round. A synthetic model keeps its layout and
// takes new bytes every round (seed + round), as a training step changes
// every weight; round 0 is the layout alone. A checkpoint (--model) is the
// same every round, opened once per process, cast to --dtype when asked.
func (c *config) model(round int) (model, error) {
	if c.modelPath == "" {
		return source.Synthetic{Size: c.size, Tensors: c.tensors, DTypes: c.dtypes, Seed: c.seed + uint64(round)}.Model()
	}
	checkpointOnce.Do(func() {
		ck, err := source.OpenCheckpoint(c.modelPath)
		if err != nil {
			checkpointErr = err
			return
		}
		if c.castTo == dtype.Invalid {
			checkpoint = ck
			return
		}
		checkpoint, checkpointErr = newCastModel(ck, c.castTo)
	})
	return checkpoint, checkpointErr
}

// expected is what receivers get of model, and its size in bytes: model
// itself, or, with --quantize, model seen through stages.Quantize as the
// sender quantizes it.
func (c *config) expected(ctx context.Context, m model) (stages.Lookuper, int64, error) {
	if c.quantize.Scheme == quant.None {
		return m, m.Size(), nil
	}
	q, err := stages.Quantize(m, c.quantize)
	if err != nil {
		return nil, 0, err
	}
	l, ok := q.(stages.Lookuper)
	if !ok {
		return nil, 0, fmt.Errorf("--quantize: the quantized model cannot look tensors up")
	}
	var size int64
	err = q.Tensors(ctx, func(t *stages.Tensor) error {
		n, err := t.Size()
		size += n
		return err
	})
	return l, size, err
}

// castModel is a checkpoint seen through stages.Cast.
type castModel struct {
	stages.Source
	lookup stages.Lookuper
	list   []*stages.Tensor
	size   int64
}

func newCastModel(ck *source.Checkpoint, to dtype.DType) (*castModel, error) {
	src := stages.Cast(ck, to)
	lk, ok := src.(stages.Lookuper)
	if !ok {
		return nil, fmt.Errorf("cast to %s cannot look tensors up", to)
	}
	m := &castModel{Source: src, lookup: lk}
	for _, t := range ck.List() {
		ct, ok := lk.Lookup(t.Name)
		if !ok {
			return nil, fmt.Errorf("cast lost tensor %q", t.Name)
		}
		n, err := ct.Size()
		if err != nil {
			return nil, err
		}
		m.list, m.size = append(m.list, ct), m.size+n
	}
	return m, nil
}

func (m *castModel) Lookup(name string) (*stages.Tensor, bool) { return m.lookup.Lookup(name) }
func (m *castModel) List() []*stages.Tensor                    { return m.list }
func (m *castModel) Size() int64                               { return m.size }

// SourceInfo forwards the checkpoint's description, so receivers can
// write the same files back.
func (m *castModel) SourceInfo() *wire.SourceInfo {
	if d, ok := m.Source.(stages.Describer); ok {
		return d.SourceInfo()
	}
	return nil
}

// outDir is where rank writes what it received with --out: one directory
// per rank, so local ranks do not write over each other.
func (c *config) outDir(rank int) string {
	return filepath.Join(c.out, "rank"+strconv.Itoa(rank))
}

// modelConfig is the --out sink's option for the checkpoint's config.json,
// beside a --model directory's files or a --model file: the sink writes it
// with each round, with transformers' FP8 quantization_config under
// --quantize fp8-block. It is nil for the synthetic model and for a
// checkpoint without one.
func (c *config) modelConfig() sink.SafetensorsOption {
	if c.modelPath == "" {
		return nil
	}
	dir := c.modelPath
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		dir = filepath.Dir(dir)
	}
	p := filepath.Join(dir, "config.json")
	if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
		return nil
	}
	return sink.SafetensorsConfig(p)
}

// modelText names the model for people: "1.0 GiB synthetic model" or
// "checkpoint PATH (8.0 GiB)".
func (c *config) modelText() string {
	if c.modelPath == "" {
		return sizeText(c.size) + " synthetic model"
	}
	text := "checkpoint " + c.modelPath
	if m, err := c.model(0); err == nil {
		text += " (" + sizeText(m.Size()) + ")"
	}
	if c.castTo != dtype.Invalid {
		text += " cast to " + c.castTo.String()
	}
	if c.quantize.Scheme != "" {
		text += ", quantized " + string(c.quantize.Scheme)
	}
	return text
}
