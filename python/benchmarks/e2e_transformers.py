"""End to end with a real model on the GPU: a Hugging Face causal LM (a small
Llama config, randomly initialised on the spot) in a trainer process, and
receivers in other processes (ipc on one GPU; nccl with one GPU per rank when
there are enough) holding a differently initialised copy. After each of three
rounds, with an optimizer step between them, every receiver's logits must
equal the trainer's bit for bit. One receiver loads through receive(), the
next through load_into(). Prints one JSON line; exits 1 on a mismatch.

    python3 benchmarks/e2e_transformers.py [receivers]     # default 2
"""

import hashlib
import json
import os
import sys

from _launch import emit, launch

ROUNDS = 3


def worker():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import weightcast

    rank = int(os.environ["RANK"])
    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
    torch.manual_seed(1 if rank == 0 else 100 + rank)  # receivers start from other weights
    model = LlamaForCausalLM(cfg).to(f"cuda:{dev}")
    ids = (torch.arange(128, device=f"cuda:{dev}") * 7919 % cfg.vocab_size).view(1, 128)

    def digest():
        with torch.no_grad():
            logits = model(ids).logits
        return hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest()

    if rank == 0:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with weightcast.Sender(device=f"cuda:{dev}", bucket="32MiB") as s:
            for v in range(1, ROUNDS + 1):
                if v > 1:  # a training step changes every weight
                    loss = model(ids, labels=ids).loss
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                s.send(model.named_parameters(), v)
                print(json.dumps({"version": v, "logits": digest(), "transport": s.transport}), flush=True)
    else:
        with weightcast.Receiver(device=f"cuda:{dev}", bucket="32MiB") as r:
            params = dict(model.named_parameters())
            before = digest()
            for v in range(1, ROUNDS + 1):
                if rank % 2:
                    with torch.no_grad():
                        for name, t in r.receive():
                            params[name].copy_(t)
                else:
                    r.load_into(params)
                print(json.dumps({"version": v, "logits": digest(), "committed": r.version, "before": before}), flush=True)


def main():
    receivers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    out = launch(os.path.abspath(__file__), 1 + receivers)
    trainer = {e["version"]: e["logits"] for e in out[0]}
    ok = len(trainer) == ROUNDS
    for rank, lines in enumerate(out[1:], 1):
        for e in lines:
            ok &= e["logits"] == trainer.get(e["version"]) and e["committed"] == e["version"] and e["before"] != trainer[1]
        ok &= len(lines) == ROUNDS
    emit(test="e2e_transformers", ok=bool(ok), transport=out[0][0]["transport"], receivers=receivers, rounds=ROUNDS)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    worker() if "--worker" in sys.argv else main()
