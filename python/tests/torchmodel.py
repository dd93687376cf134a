"""The torch test model the torch and verl tests send, and digests of what
arrives: built from a seed, so the test process and every rank process make
the same tensors. Works on torch 1.13 (Debian's) and 2.x."""

import hashlib

import torch


class Tiny(torch.nn.Module):
    """A small decoder-shaped module: embeddings tied to the LM head (two
    names, one storage in state_dict), projections, norms and biases."""

    def __init__(self, vocab=96, dim=32, layers=2):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            block = torch.nn.Module()
            block.q_proj = torch.nn.Linear(dim, dim, bias=True)
            block.o_proj = torch.nn.Linear(dim, dim, bias=False)
            block.up_proj = torch.nn.Linear(dim, 3 * dim, bias=False)
            block.input_layernorm = torch.nn.LayerNorm(dim)
            self.layers.append(block)
        self.norm = torch.nn.LayerNorm(dim)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied


def model(seed):
    torch.manual_seed(seed)
    return Tiny()


def weights(seed):
    """(name, tensor) of one version: the module's state_dict (tied weights
    under both names; parameters requiring grad through named_parameters)
    plus tensors of every dtype the package takes, empty ones, and
    contiguous views with a storage offset."""
    m = model(seed)
    g = torch.Generator().manual_seed(seed + 1000)
    out = list(m.state_dict().items())
    params = dict(m.named_parameters())
    out[1] = ("layers.0.q_proj.weight", params["layers.0.q_proj.weight"])  # requires grad
    assert out[1][1].requires_grad
    base = torch.randn(4096, generator=g)
    grid = torch.randn(64, 48, generator=g)
    out += [
        ("extra.bf16", torch.randn(300, 7, generator=g).to(torch.bfloat16)),
        ("extra.f16", torch.randn(513, generator=g).to(torch.float16)),
        ("extra.f64", torch.randn(17, 3, generator=g).to(torch.float64)),
        ("extra.i64", torch.randint(-2**40, 2**40, (129,), generator=g)),
        ("extra.i32", torch.randint(-2**30, 2**30, (8, 8), generator=g).to(torch.int32)),
        ("extra.i16", torch.randint(-2**15, 2**15, (31,), generator=g).to(torch.int16)),
        ("extra.i8", torch.randint(-128, 128, (5,), generator=g).to(torch.int8)),
        ("extra.u8", torch.randint(0, 256, (1000,), generator=g).to(torch.uint8)),
        ("extra.bool", torch.randint(0, 2, (77,), generator=g).to(torch.bool)),
        ("extra.empty", torch.zeros(0, 4)),
        ("extra.scalar", torch.tensor(3.5)),
        ("view.offset", base[1000:3000]),            # a 1-D view 1000 elements in
        ("view.rows", grid[10:20]),                   # rows 10..19 of a 2-D tensor
        ("view.bf16", base.to(torch.bfloat16)[7:1031].view(32, 32)),
    ]
    return out


def to_bytes(t):
    """A tensor's elements as bytes (bf16 through int16 and the float8
    dtypes of torch 2.x through uint8: numpy has neither)."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.is_floating_point() and t.element_size() == 1:
        t = t.view(torch.uint8)
    return t.numpy().tobytes()


def digest(name, t):
    return hashlib.sha256(to_bytes(t)).hexdigest() + f":{str(t.dtype).replace('torch.', '')}:{list(t.shape)}"


def digests(named):
    return {name: digest(name, t) for name, t in named}


def cast(named, to):
    """What a rollout dtype cast gives: F32, BF16 and F16 tensors converted
    to `to` (F64 and the integer dtypes as they are)."""
    floats = (torch.float32, torch.bfloat16, torch.float16)
    return [(n, t.detach().to(to) if t.dtype in floats else t) for n, t in named]
