"""A trainer updating a vLLM engine's weights with weightcast, every step.

    python3 vllm_rollout.py MODEL_DIR [--tp 2] [--steps 3]

The trainer process holds a transformers model (trained here by a stand-in
step) and a vLLM ``LLM`` whose workers load weightcast's worker extension.
Each vLLM worker is one weightcast receiver; the trainer is rank 0 and serves
the rendezvous itself. ``open_group`` and ``update`` are the whole of the
integration; ``main`` is a runnable use of them.
"""

import argparse
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor

import weightcast


def open_group(llm, workers, host="127.0.0.1", port=None, **options):
    """Join the trainer (rank 0, serving the rendezvous at host:port) and
    llm's workers (ranks 1..workers) in one group; returns the Sender.
    options are the ones both sides take (group, transport, bucket, timeout,
    checksum, secret_file, tls_*)."""
    if port is None:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    where = dict(rendezvous=f"etcd://{host}:{port}", run_id=uuid.uuid4().hex, world_size=1 + workers)
    with ThreadPoolExecutor(1) as pool:  # both sides wait for each other
        joined = pool.submit(llm.collective_rpc, "weightcast_open", kwargs=dict(where, first_rank=1, **options))
        sender = weightcast.Sender(rank=0, serve_rendezvous=True, **where, **options)
        joined.result()
    return sender


def update(llm, sender, named_tensors, version):
    """One weight update: the workers receive into their load_weights while
    the trainer sends; returns each worker's report (version, tensors,
    bytes, loaded)."""
    with ThreadPoolExecutor(1) as pool:
        received = pool.submit(llm.collective_rpc, "weightcast_receive")
        sender.send(named_tensors, version)
        return received.result()


def main():
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(model=args.model, tensor_parallel_size=args.tp, worker_extension_cls="weightcast.vllm.WorkerExtension")
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).cuda()
    with open_group(llm, args.tp) as sender:
        for step in range(1, args.steps + 1):
            with torch.no_grad():  # stand-in for a training step
                for p in model.parameters():
                    p.mul_(1.0001)
            reports = update(llm, sender, model.named_parameters(), version=step)
            print(f"step {step}: {reports[0]['tensors']} tensors, version {reports[0]['version']} on {len(reports)} workers")
    llm.collective_rpc("weightcast_close")


if __name__ == "__main__":
    main()
