"""An FP8 checkpoint written by weightcast loads in transformers, on the GPU.

For a small Llama (a LlamaConfig, randomly initialised, saved with
save_pretrained in BF16; once with its own LM head, once with the head tied
to the embedding), the demo syncs the checkpoint to a receiver with
--quantize fp8-block --out, which writes the block-scaled FP8 weights
(F8_E4M3 codes, F32 *_scale_inv) and the model's config.json with
transformers' fine-grained FP8 quantization_config ("quant_method": "fp8",
128x128 blocks, modules_to_not_convert: the modules left in BF16). The
script then checks, per case:

  - config.json's quantization_config and its modules_to_not_convert
    (the embedding and the LM head, nothing else);
  - every quantized weight dequantizes (codes x scale) to within the FP8
    rounding bound of the BF16 original;
  - AutoModelForCausalLM.from_pretrained(out, device_map="cuda") builds
    the model with FP8 linear layers (float8_e4m3fn weights) and a BF16
    embedding and LM head; where transformers' FP8 kernels (the `kernels`
    package) are not installed, its loader is asked to dequantize
    (FineGrainedFP8Config(dequantize=True)), and its BF16 model must then
    match weightcast's own dequantization (cosine of logits >= 0.9999);
  - its logits on a fixed batch are close to the BF16 model's: cosine
    similarity at least 0.99, relative L2 error at most 0.15 (FP8
    weights and transformers' dynamic FP8 activations); also reported
    against the BF16 model holding the dequantized weights (the weights'
    rounding alone) and the top-1 agreement.

Prints one JSON line; exits 1 when a check fails.

    python3 benchmarks/fp8_transformers_load.py [--demo PATH] [--transport auto|tcp|ipc] [--keep DIR]

The demo binary: --demo, else $WEIGHTCAST_DEMO_BIN, else the demo of
`make gpu-bins` (.gpu/demo, next to .gpu/python), else bin/demo. Needs
torch with CUDA, transformers (5.x; 4.4x and later read the same config),
accelerate, safetensors and a GPU of compute capability 8.9 or more.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 128


def find_demo(given):
    for p in (given, os.environ.get("WEIGHTCAST_DEMO_BIN"), os.path.join(HERE, "..", "..", "demo"),
              os.path.join(HERE, "..", "..", ".gpu", "demo"), os.path.join(HERE, "..", "..", "bin", "demo")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return os.path.abspath(p)
    raise SystemExit("no demo binary: give --demo PATH or WEIGHTCAST_DEMO_BIN (make gpu-bins builds .gpu/demo)")


def llama(tied):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # Every linear layer's input width a multiple of 128: transformers'
    # FP8 activations are quantized in groups of 128.
    cfg = LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                      tie_word_embeddings=tied)
    torch.manual_seed(3 if tied else 2)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def from_pretrained(cls, path, **kw):
    """cls.from_pretrained in BF16, with transformers 5's dtype= or 4's torch_dtype=."""
    import torch

    try:
        return cls.from_pretrained(path, dtype=torch.bfloat16, **kw)
    except TypeError:
        return cls.from_pretrained(path, torch_dtype=torch.bfloat16, **kw)


def dequantized(out):
    """The checkpoint's tensors, FP8 weights turned back into float32
    (codes x their block's scale), and for each of those weights its
    scales spread over its elements."""
    import torch
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(out, f)))
    scales = {}
    for n in [n for n, t in tensors.items() if t.dtype == torch.float8_e4m3fn]:
        codes, s = tensors[n].float(), tensors.pop(n + "_scale_inv").float()
        rows, cols = codes.shape
        scales[n] = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
        tensors[n] = codes * scales[n]
    return tensors, scales


def compare(a, b):
    """The cosine similarity of two logits tensors and the relative L2
    error of b against a."""
    import torch

    a, b = a.float().flatten(), b.float().flatten()
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    rel = float((a - b).norm() / a.norm())
    return cos, rel


def case(demo, transport, work, tied):
    import torch
    from transformers import AutoModelForCausalLM

    src, out = os.path.join(work, "bf16"), os.path.join(work, "fp8")
    ref = llama(tied)
    ref.save_pretrained(src)
    started = time.time()
    cmd = [demo, "--ranks", "2", "--rounds", "1", "--model", src, "--quantize", "fp8-block", "--out", out,
           "--transport", transport, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    demo_seconds = time.time() - started
    rank1 = os.path.join(out, "rank1")
    res = {"tied": tied, "demo_seconds": round(demo_seconds, 2), "errors": []}
    err = res["errors"].append

    with open(os.path.join(rank1, "config.json")) as f:
        q = json.load(f).get("quantization_config")
    res["quantization_config"] = q
    keep = ["lm_head", "model.embed_tokens"]
    if not q or q.get("quant_method") != "fp8" or q.get("activation_scheme") != "dynamic" or \
            q.get("weight_block_size") != [BLOCK, BLOCK] or q.get("modules_to_not_convert") != keep:
        err(f"config.json's quantization_config is {q}, want fp8, dynamic, [128, 128], modules_to_not_convert {keep}")

    # The weights: every linear weight quantized, within FP8's rounding.
    deq, scales = dequantized(rank1)
    weights = sorted(scales)
    orig = {n: t.detach().float().cpu() for n, t in ref.state_dict().items()}
    linear = sorted(n for n in orig if n.endswith("_proj.weight"))
    res["quantized"] = len(weights)
    if weights != linear:
        err(f"quantized {weights}, want the linear weights {linear}")
    worst = 0.0
    for n in weights:
        o, d = orig[n], deq[n]
        # Half a step of E4M3's 3-bit mantissa at the value, or of its
        # subnormal step, times the block's scale.
        bound = torch.maximum(o.abs() / 16, scales[n] * 2.0 ** -10) + o.abs() * 2.0 ** -20
        worst = max(worst, float(((d - o).abs() / bound).max()))
    res["worst_error_over_bound"] = round(worst, 4)
    if worst > 1:
        err(f"a dequantized weight is off by {worst:.3f} times its FP8 rounding bound")

    # transformers loads the FP8 checkpoint with FP8 linear layers.
    dev = "cuda"
    try:
        fp8 = from_pretrained(AutoModelForCausalLM, rank1, device_map=dev).eval()
        res["loaded_as"], want_q = "fp8", torch.float8_e4m3fn
    except ImportError as e:
        # transformers' FP8 matmul kernels are a package of their own
        # (`kernels`); without it, its loader still reads the checkpoint
        # (codes, scales, config) and dequantizes it to BF16.
        from transformers import FineGrainedFP8Config
        res["fp8_kernels"] = f"{type(e).__name__}: {e}"[:200]
        fp8 = from_pretrained(AutoModelForCausalLM, rank1, device_map=dev,
                              quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
        res["loaded_as"], want_q = "dequantized by transformers' FP8 loader (its FP8 kernels are not installed)", torch.bfloat16
    qp = fp8.model.layers[0].self_attn.q_proj
    res["q_proj"] = f"{type(qp).__name__} {qp.weight.dtype}"
    res["lm_head"] = f"{type(fp8.lm_head).__name__} {fp8.lm_head.weight.dtype}"
    if qp.weight.dtype != want_q or fp8.lm_head.weight.dtype != torch.bfloat16 or \
            fp8.model.embed_tokens.weight.dtype != torch.bfloat16:
        err(f"transformers built q_proj as {res['q_proj']}, lm_head as {res['lm_head']}")

    # Logits against the BF16 model, and against the BF16 model holding
    # the dequantized weights.
    ref = ref.to(dev)
    deq_model = llama(tied)
    deq_model.load_state_dict({n: deq[n].to(torch.bfloat16) if n in deq else t for n, t in ref.state_dict().items()})
    deq_model = deq_model.to(dev)
    ids = (torch.arange(2 * 64, device=dev) * 7919 % ref.config.vocab_size).view(2, 64)
    with torch.no_grad():
        want, got, wq = ref(ids).logits, fp8(ids).logits, deq_model(ids).logits
    res["cos"], res["rel"] = (round(v, 5) for v in compare(want, got))
    res["cos_dequantized_bf16"], res["rel_dequantized_bf16"] = (round(v, 5) for v in compare(want, wq))
    res["top1_agree"] = round(float((want.argmax(-1) == got.argmax(-1)).float().mean()), 4)
    if want_q == torch.bfloat16:
        # Dequantized by transformers: the same weights as ours, dequantized.
        res["cos_vs_our_dequantized"], res["rel_vs_our_dequantized"] = (round(v, 6) for v in compare(wq, got))
        if not res["cos_vs_our_dequantized"] >= 0.9999:
            err(f"transformers' dequantized model differs from weightcast's dequantization: cosine {res['cos_vs_our_dequantized']}")
    if not (res["cos"] >= 0.99 and res["rel"] <= 0.15):
        err(f"logits: cosine {res['cos']}, relative error {res['rel']} (want >= 0.99, <= 0.15)")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", help="the demo binary")
    ap.add_argument("--transport", default="auto", help="the demo's --transport (default auto)")
    ap.add_argument("--keep", help="write the checkpoints under this directory and keep them")
    args = ap.parse_args()

    import torch
    import transformers

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    demo = find_demo(args.demo)
    base = args.keep or tempfile.mkdtemp(prefix="wc-fp8-")
    result = {"torch": torch.__version__, "transformers": transformers.__version__,
              "gpu": torch.cuda.get_device_name(0), "demo": demo, "cases": []}
    ok = True
    try:
        for tied in (False, True):
            work = os.path.join(base, "tied" if tied else "untied")
            os.makedirs(work, exist_ok=True)
            try:
                r = case(demo, args.transport, work, tied)
            except Exception as e:  # report it in the JSON line, then fail
                r = {"tied": tied, "errors": [f"{type(e).__name__}: {e}"]}
            ok = ok and not r["errors"]
            result["cases"].append(r)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    result["ok"] = ok
    print(json.dumps(result), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
