"""Write the reference checkpoints under testdata/reference/ with the Python
safetensors package (and transformers / huggingface_hub for the sharded ones).

    python3 safetensors/testdata/make_reference.py safetensors/testdata/reference

The Go tests read these files and check that writing them back with the same
tensor order and metadata reproduces them byte for byte.
"""
import os
import sys

import numpy as np
import safetensors
import safetensors.numpy
import torch
from safetensors.torch import save_file


def main(out):
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    t = {
        "model.embed.weight": torch.randn(4, 3, generator=g),
        "model.layers.0.q_proj.weight": torch.randn(3, 3, generator=g).to(torch.bfloat16),
        "model.layers.0.up.weight": torch.randn(2, 3, generator=g).to(torch.float16),
        "model.norm.weight": torch.randn(3, generator=g, dtype=torch.float64),
        "position_ids": torch.arange(5, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "u8": torch.arange(7, dtype=torch.uint8),
        "i8": torch.tensor([-1, 2, -3], dtype=torch.int8),
        "i16": torch.tensor([-300, 300], dtype=torch.int16),
        "i32": torch.tensor([[1, -2], [3, -4]], dtype=torch.int32),
        "u16": torch.tensor([1, 65535], dtype=torch.uint16),
        "u32": torch.tensor([7], dtype=torch.uint32),
        "u64": torch.tensor([9, 10], dtype=torch.uint64),
        "fp8_e4m3": torch.tensor([1.0, -2.0]).to(torch.float8_e4m3fn),
        "fp8_e5m2": torch.tensor([0.5]).to(torch.float8_e5m2),
        "scalar": torch.tensor(3.5),
        "empty_a": torch.zeros(0, 3),
        "empty_b": torch.zeros(2, 0),
        'quote " and \\ backslash': torch.ones(1),
        "unicod\u00e9/\u540d\u524d \u2028 <&>": torch.ones(2, dtype=torch.bfloat16),
        "tab\there\nnew\x01ctl\x7f": torch.ones(1, dtype=torch.int32),
    }
    save_file(t, f"{out}/mixed.safetensors", metadata={"format": "pt", "note": "a \"b\" <c> \u00e9\n"})
    save_file({}, f"{out}/empty.safetensors")
    save_file({}, f"{out}/empty_meta.safetensors", metadata={})
    safetensors.numpy.save_file(
        {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.arange(3, dtype=np.int16)},
        f"{out}/numpy_nometa.safetensors")

    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
        torch.manual_seed(0)
        m = GPT2LMHeadModel(cfg)
        m.save_pretrained(f"{out}/sharded_transformers", max_shard_size="1KB")
        for f in os.listdir(f"{out}/sharded_transformers"):
            if not f.endswith((".safetensors", ".json")) or f in ("config.json", "generation_config.json"):
                os.remove(f"{out}/sharded_transformers/{f}")
    except Exception as e:  # keep the rest
        print("transformers:", repr(e), file=sys.stderr)
    try:
        from huggingface_hub import save_torch_state_dict
        sd = {f"layer.{i}.weight": torch.full((8,), float(i)) for i in range(6)}
        sd["layer.0.bias"] = torch.zeros(2, dtype=torch.bfloat16)
        save_torch_state_dict(sd, f"{out}/sharded_hub", max_shard_size=80)
    except Exception as e:
        print("huggingface_hub:", repr(e), file=sys.stderr)
    print("safetensors", safetensors.__version__, "torch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
