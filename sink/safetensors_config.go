package sink

// The config.json a Safetensors writes beside a round's files, so
// that an FP8 round loads in transformers.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/safetensors"
)

// configName is the Hugging Face model configuration a Safetensors
// writes or updates.
const configName = "config.json"

// maxConfigSize bounds the config.json a Safetensors reads.
const maxConfigSize = 16 << 20

// SafetensorsConfig makes the sink write config.json with each round: the
// Hugging Face config.json at path (the model's, beside the source
// checkpoint's files) with its quantization_config made to describe the
// round (quant.UpdateHFConfig): transformers' fine-grained FP8
// (quant_method "fp8", 128×128 blocks, the modules left unquantized in
// modules_to_not_convert) when the round holds block-scaled FP8 weights,
// as a sender with --quantize fp8-block sends, and none when it holds
// none. An empty path changes nothing.
//
// Without it, a sink whose directory already holds a config.json (a copy
// of the model's directory) updates that file the same way with each
// round, and rewrites it only when that changes it; with neither, it
// writes no config.json (a synthetic model has none). The config.json is
// put in place with the round's files, and never removed.
func SafetensorsConfig(path string) SafetensorsOption {
	return func(o *safetensorsOptions) { o.config = path }
}

// stageConfig writes the round's config.json into its directory, where
// there is one to write, and names it in r.config.
func (s *Safetensors) stageConfig(r *stRound) error {
	src, b, err := s.readConfig()
	if err != nil || b == nil {
		return err
	}
	var ts []quant.TensorMeta
	for _, sh := range r.shards {
		if sh.name == configName {
			return fmt.Errorf("safetensors sink: the source has a file named %s, the name of the model's configuration", configName)
		}
		for _, ti := range sh.infos {
			ts = append(ts, quant.TensorMeta{Name: ti.Name, DType: ti.DType, Shape: ti.Shape})
		}
	}
	out, changed, err := quant.UpdateHFConfig(b, ts)
	if err != nil {
		return fmt.Errorf("safetensors sink: %s: %w", src, err)
	}
	if !changed && s.opts.config == "" {
		return nil // the directory's own, as it is
	}
	if err := safetensors.WriteFileAtomic(filepath.Join(r.staging, configName), out, s.fileOptions()...); err != nil {
		return fmt.Errorf("safetensors sink: %w", err)
	}
	r.config = configName
	return nil
}

// readConfig returns the config.json to update and where it came from:
// the SafetensorsConfig file, else the sink directory's own, else none
// (nil).
func (s *Safetensors) readConfig() (string, []byte, error) {
	if p := s.opts.config; p != "" {
		f, err := os.Open(p)
		if err != nil {
			return p, nil, fmt.Errorf("safetensors sink: the model's configuration: %w", err)
		}
		defer f.Close()
		b, err := readConfigFrom(f)
		if err != nil {
			return p, nil, fmt.Errorf("safetensors sink: reading %s: %w", p, err)
		}
		return p, b, nil
	}
	p := filepath.Join(s.dir, configName)
	f, err := s.fs.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil, nil
	}
	if err != nil {
		return p, nil, fmt.Errorf("safetensors sink: %w", err)
	}
	defer f.Close()
	b, err := readConfigFrom(f)
	if err != nil {
		return p, nil, fmt.Errorf("safetensors sink: reading %s: %w", p, err)
	}
	return p, b, nil
}

// readConfigFrom reads a whole config.json of at most maxConfigSize bytes.
func readConfigFrom(r io.ReaderAt) ([]byte, error) {
	b, err := io.ReadAll(io.NewSectionReader(r, 0, maxConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxConfigSize {
		return nil, fmt.Errorf("larger than %d bytes", maxConfigSize)
	}
	return b, nil
}
