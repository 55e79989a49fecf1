"""The attention implementations the benchmarks compare, as a registry: name -> Backend.

A backend turns inputs in flash-attn's layout, q (batch, seqlen, heads, d) and k, v alike, into a
zero-argument callable that returns O in the same layout.  Other modules add backends with
@register (a new tileattn kernel family, a decode kernel) and reach the CLI through --plugin.
"tileattn@VALUE" runs tileattn with TILEATTN_FORWARD_FAMILY=VALUE set around each call and
TILEATTN_BACKWARD_FAMILY=VALUE around its backward, for libraries that read them per call (a
library that reads them once needs its own process).
"""
import contextlib
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# tileattn@sm80 next to tileattn: on Hopper the default forward is the sm90 family, and the sweep
# shows what it buys over the FA2-class sm80 kernels.
DEFAULT_SWEEP = ("tileattn", "tileattn@sm80", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math",
                 "fa1-triton", "fa1-triton-seqpar")


@dataclass(frozen=True)
class Backend:
    name: str
    make: Callable  # (q, k, v, causal) -> callable returning O
    backward: bool = True  # does O carry a gradient
    materializes_scores: bool = False  # needs B*H*S^2 memory (SDPA math)
    cuda_only: bool = False


REGISTRY = {}


def register(name, **options):
    def decorate(make):
        REGISTRY[name] = Backend(name, make, **options)
        return make
    return decorate


def get(name):
    """The backend called `name`; "tileattn@VALUE" is tileattn with a forward family chosen."""
    if name in REGISTRY:
        return REGISTRY[name]
    base, _, family = name.partition("@")
    if base == "tileattn" and family:
        return Backend(name, lambda q, k, v, causal: _tileattn(q, k, v, causal, family))
    raise KeyError(f"unknown backend '{name}' (known: {', '.join(sorted(REGISTRY))}, tileattn@FAMILY)")


@contextlib.contextmanager
def _env(key, value):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[key]
        else:
            os.environ[key] = old


class _BackwardFamily(torch.autograd.Function):
    """Identity on tensors whose backward sets TILEATTN_BACKWARD_FAMILY (enter=True, placed on the
    attention's output, so it runs just before the attention's backward) or restores it (placed
    on the inputs, so it runs just after).  The backward runs outside the forward's `with`."""
    KEY = "TILEATTN_BACKWARD_FAMILY"
    saved = []

    @staticmethod
    def forward(ctx, enter, family, *tensors):
        ctx.enter, ctx.family = enter, family
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        if ctx.enter:
            _BackwardFamily.saved.append(os.environ.get(_BackwardFamily.KEY))
            os.environ[_BackwardFamily.KEY] = ctx.family
        else:
            old = _BackwardFamily.saved.pop()
            if old is None:
                del os.environ[_BackwardFamily.KEY]
            else:
                os.environ[_BackwardFamily.KEY] = old
        return (None, None, *grads)


def _tileattn(q, k, v, causal, family=None):
    import tileattn

    if family is None:
        return lambda: tileattn.flash_attn_func(q, k, v, causal=causal)

    def run():
        with _env("TILEATTN_FORWARD_FAMILY", family):
            if not torch.is_grad_enabled() or not q.requires_grad:
                return tileattn.flash_attn_func(q, k, v, causal=causal)
            q2, k2, v2 = _BackwardFamily.apply(False, family, q, k, v)
            out = tileattn.flash_attn_func(q2, k2, v2, causal=causal)
            return _BackwardFamily.apply(True, family, out)[0]
    return run


register("tileattn")(_tileattn)


def _tileattn_deterministic(q, k, v, causal):
    """tileattn with deterministic=True: the backward's dQ added in a fixed order."""
    import tileattn

    return lambda: tileattn.flash_attn_func(q, k, v, causal=causal, deterministic=True)


register("tileattn-deterministic")(_tileattn_deterministic)


def _sdpa(kind):
    def make(q, k, v, causal):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def run():
            with sdpa_kernel(kind):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
        return run
    return make


register("sdpa-flash")(_sdpa(SDPBackend.FLASH_ATTENTION))
register("sdpa-cudnn", cuda_only=True)(_sdpa(SDPBackend.CUDNN_ATTENTION))
register("sdpa-efficient", cuda_only=True)(_sdpa(SDPBackend.EFFICIENT_ATTENTION))
register("sdpa-math", materializes_scores=True)(_sdpa(SDPBackend.MATH))


def _fa1(rows_per_program):
    def make(q, k, v, causal):
        from bench.fa1_triton import fa1_attention

        return lambda: fa1_attention(q, k, v, causal=causal, q_rows_per_program=rows_per_program)
    return make


# FA1's grid (batch x heads), and the same kernel with FA2's sequence-parallel grid: 128 query
# rows per program, the query tile of tileattn's sm80 kernels (tile_config.h).
register("fa1-triton", backward=False, cuda_only=True)(_fa1(None))
register("fa1-triton-seqpar", backward=False, cuda_only=True)(_fa1(128))


def load_plugins(modules):
    """Import modules that call register(); their backends then resolve by name."""
    import importlib

    for module in modules:
        importlib.import_module(module)


def skip_reason(backend, device, direction):
    """Why `backend` cannot run here at all (None when it can)."""
    if backend.cuda_only and torch.device(device).type != "cuda":
        return "needs CUDA"
    if direction != "fwd" and not backend.backward:
        return "forward only"
    return None
