"""The torch.library custom ops behind the flash_attn_* functions.

Four ops: tileattn::fwd / tileattn::bwd for the batch form (B, S, H, D) and tileattn::varlen_fwd /
tileattn::varlen_bwd for the packed variable-length form (total, H, D).  Each has a fake (meta)
implementation, so torch.compile traces it without running it, and the forward ops have autograd
formulas that call the backward ops, so compiled graphs contain both directions.

The hot path does no host sync: it reads shapes and strides, allocates the outputs, fills one
parameter struct and calls the library on the current CUDA stream.  Dropout's Philox seed and
offset come from torch's default generator of the tensors' device (see _philox_state) and travel
to the backward as a small CPU tensor, so the backward redraws exactly the forward's mask.
"""

import math
import os
from typing import Optional, Tuple

import torch

from . import _ffi

Tensor = torch.Tensor

_DTYPES = {torch.float16: _ffi.FLOAT16, torch.bfloat16: _ffi.BFLOAT16, torch.float32: _ffi.FLOAT32}

# Debug aid: fill every output with NaN before the library writes it, so a test sees any element
# the library forgot.  Off by default (it costs a pass over each output).
poison_outputs = os.environ.get("TILEATTN_POISON_OUTPUTS", "0") not in ("", "0")


def _new_output(like, shape=None, dtype=None):
    """A fresh contiguous output on `like`'s device: `like`'s shape and dtype unless given."""
    if shape is None:  # empty_like is ~2 us cheaper per call than torch.empty(shape, ...)
        out = torch.empty_like(like, memory_format=torch.contiguous_format)
    else:
        out = like.new_empty(shape, dtype=dtype)
    if poison_outputs:
        out.fill_(math.nan)
    return out


def _new_probs(like, shape):
    """attn_probs, float32 (batch, nheads, seqlen_q, seqlen_k): sized by the call's bounds, so a
    varlen call's max_seqlen_q/k can ask for more than the device holds.  torch's error keeps its
    type (callers catch torch.OutOfMemoryError) and gains the argument that asked for it."""
    try:
        return _new_output(like, shape, torch.float32)
    except RuntimeError as error:
        message = (f"return_attn_probs: the float32 attn_probs of shape {tuple(shape)} (batch, nheads, "
                   f"max_seqlen_q, max_seqlen_k) cannot be allocated: {error}")
        try:
            replacement = type(error)(message)
        except Exception:  # a subclass whose constructor takes other arguments
            replacement = RuntimeError(message)
        raise replacement from error


def _last_dim_contiguous(x):
    return x if x is None or x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _rows(t):
    """(batch, row, head) element strides of a (B, S, H, D) or packed (total, H, D) tensor."""
    stride = t.stride()
    return stride[:3] if len(stride) == 4 else (0, stride[0], stride[1])


# torch.cuda.current_stream(device).cuda_stream builds a Stream object: 6.4 us a call on the H200
# host against 0.2 us for the raw handle that Inductor's generated code reads the same way.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _backend(device):
    """(device enum, stream handle, CPU threads) for tensors on `device`, or a clear error."""
    if device.type == "cpu":
        return _ffi.DEVICE_CPU, None, torch.get_num_threads()
    if device.type == "cuda":
        if not _ffi.library().has_cuda:
            raise _ffi.BackendError(
                f"tileattn: q is on {device} but {_ffi.library().path} was built without the CUDA "
                "backend; rebuild with CUDA (pip install . -C cmake.define.TILEATTN_CUDA=ON, or "
                "TILEATTN_CUDA=ON pip install .)", "q")
        return _ffi.DEVICE_CUDA, _current_stream(device), 0
    raise _ffi.BackendError(
        f"tileattn: q is on device '{device}', which tileattn has no backend for; "
        "use CPU or CUDA tensors", "q")


_U64 = 1 << 64


def _philox_state(device, num_streams):
    """Reserve `num_streams` Philox stream ids and return (seed, offset) as Python ints.

    The library gives (batch b, head h) the stream offset + b * H + h, so one call consumes B * H
    offsets (rounded up to a multiple of 4).  On CUDA the default generator's seed and offset are
    used and the offset is advanced, as torch's own CUDA random ops do, without touching the
    device.  The CPU generator has no Philox offset, so a fresh 63-bit seed is drawn from it with
    offset 0.  Either way torch.manual_seed reproduces the mask.
    """
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
        seed = generator.initial_seed()
        offset = generator.get_offset()
        generator.set_offset(offset + (num_streams + 3) // 4 * 4)
        return seed, offset
    return int(torch.empty((), dtype=torch.int64).random_()), 0


def _op_outputs(device, dropout_p, out, lse, probs, seed, offset):
    """A forward op's four outputs from its launch's: an empty placeholder when probs were not
    asked for, and the Philox state as a tensor for the backward."""
    if probs is None:
        probs = _empty_probs(device)
    return out, lse, probs, _rng_state_tensor(dropout_p, seed, offset)


def _direct(run):
    """A forward op's implementation for a call autograd does not record: `run` (the launch) on the
    op's arguments without the last, `deterministic`, which only the backward reads; no placeholder
    probs and no rng_state tensor (two allocations, ~10 us a call on the H200 host)."""
    def call(*args):
        out, lse, probs, _, _ = run(*args[:-1])
        return out, lse, probs, None
    return call


# The rng_state of every eager call without dropout: nothing writes it and the backward ignores
# it, so one shared tensor saves an allocation per call.  The op (traced) path still returns a
# fresh one, as a custom op's outputs must be.
_NO_DROPOUT_RNG_STATE = torch.zeros((2,), dtype=torch.int64)


def _eager_outputs(run):
    """A forward's launch for autograd's eager path (_eager_function): the op's outputs but with
    None instead of the empty attn_probs placeholder, and the shared rng_state whenever seed and
    offset are 0 (always without dropout; a dropout call seeded with 0 at offset 0 saves those
    values too)."""
    def call(*args):
        out, lse, probs, seed, offset = run(*args[:-1])
        rng_state = (_NO_DROPOUT_RNG_STATE if seed == 0 and offset == 0
                     else _seed_offset_tensor(seed, offset))
        return out, lse, probs, rng_state
    return call


def _rng_state_tensor(dropout_p, seed, offset):
    """(seed, offset) as int64 (the uint64 seed in two's complement), on the CPU so reading it in
    the backward never syncs.  Without dropout the backward ignores it."""
    if dropout_p == 0:
        return torch.zeros((2,), dtype=torch.int64)
    return _seed_offset_tensor(seed, offset)


def _seed_offset_tensor(seed, offset):
    return torch.tensor([seed - _U64 if seed >= 1 << 63 else seed, offset], dtype=torch.int64)


def _fill_forward(p, q, k, v, out, lse, probs, *, batch, seqlen_q, seqlen_k, varlen,
                  cu_seqlens_q, cu_seqlens_k, seqused_k, dropout_p, softmax_scale,
                  window_left, window_right, softcap, alibi_slopes, seed, offset):
    """Fill a FwdParams from tensors; `out`, `lse` and `probs` (or None) are the outputs."""
    device, stream, threads = _backend(q.device)
    dtype = _DTYPES.get(q.dtype)
    if dtype is None:
        raise _ffi.DtypeError(f"tileattn: q has dtype {q.dtype}; expected float16 or bfloat16 "
                              "(float32 on the CPU)", "q")
    p.q, p.k, p.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
    p.q_batch_stride, p.q_row_stride, p.q_head_stride = _rows(q)
    p.k_batch_stride, p.k_row_stride, p.k_head_stride = _rows(k)
    p.v_batch_stride, p.v_row_stride, p.v_head_stride = _rows(v)
    p.out = out.data_ptr()
    p.out_batch_stride, p.out_row_stride, p.out_head_stride = _rows(out)
    p.softmax_lse = lse.data_ptr()
    if varlen:  # (H, total_q)
        p.lse_batch_stride, p.lse_head_stride = 0, lse.stride(0)
    else:  # (B, H, Sq)
        p.lse_batch_stride, p.lse_head_stride = lse.stride(0), lse.stride(1)
    if probs is not None:
        p.attn_probs = probs.data_ptr()
        p.probs_batch_stride, p.probs_head_stride, p.probs_row_stride = probs.stride()[:3]
    p.batch, p.seqlen_q, p.seqlen_k = batch, seqlen_q, seqlen_k
    p.num_heads, p.num_heads_k, p.head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    if varlen:
        p.cu_seqlens_q, p.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        p.total_q, p.total_k = q.shape[0], k.shape[0]
    if seqused_k is not None:
        p.seqused_k = seqused_k.data_ptr()
    p.softmax_scale = softmax_scale
    p.window_left, p.window_right = window_left, window_right
    p.softcap = softcap
    if alibi_slopes is not None:
        p.alibi_slopes = alibi_slopes.data_ptr()
        p.alibi_batch_stride = alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0
    p.dropout_p = dropout_p
    p.philox_seed, p.philox_offset = seed, offset
    p.dtype, p.device, p.stream, p.num_threads = dtype, device, stream, threads


def _fill_backward(p, dout, dq, dk, dv, deterministic):
    p.dout = dout.data_ptr()
    p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride = _rows(dout)
    p.dq = dq.data_ptr()
    p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride = _rows(dq)
    p.dk = dk.data_ptr()
    p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride = _rows(dk)
    p.dv = dv.data_ptr()
    p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride = _rows(dv)
    p.deterministic = 1 if deterministic else 0


def _on_device(device, call, params):
    """Run the library call with `device` current (the CUDA backend launches on the current
    device, and the tensors may live on another one); returns what `call` returns."""
    if (device.type == "cuda" and device.index is not None
            and device.index != torch.cuda.current_device()):
        with torch.cuda.device(device):
            return call(params)
    return call(params)


def _empty_probs(device):
    return torch.empty((0,), dtype=torch.float32, device=device)


# ---------------------------------------------------------------------------------------------
# Batch form: q (B, Sq, H, D), k/v (B, Sk, Hk, D); lse (B, H, Sq); probs (B, H, Sq, Sk).

def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, dropout_p: float, softmax_scale: float,
        window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
        return_probs: bool, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (out, softmax_lse, attn_probs or an empty tensor, rng_state).  `deterministic`
    only matters to the backward that autograd runs later."""
    return _op_outputs(q.device, dropout_p, *_fwd_run(
        q, k, v, dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes,
        return_probs))


def _fwd_run(q, k, v, dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes,
             return_probs):
    """The forward's launch: (out, lse, probs or None, philox seed, philox offset)."""
    params, out, lse, probs, seed, offset, copies = _fwd_params(
        q, k, v, dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes,
        return_probs)
    _on_device(q.device, _ffi.library().forward, params)
    del copies  # alive until the library has read them
    return out, lse, probs, seed, offset


def _fwd_params(q, k, v, dropout_p, softmax_scale, window_left, window_right, softcap,
                alibi_slopes, return_probs):
    """(params, out, lse, probs or None, seed, offset, copies) of one forward; `copies` holds the
    inputs copied to make a last dim contiguous, which params point at (keep it until the call
    returns)."""
    given = (q, k, v, alibi_slopes)
    q, k, v, alibi_slopes = (_last_dim_contiguous(x) for x in given)
    copies = tuple(b for a, b in zip(given, (q, k, v, alibi_slopes)) if a is not b)
    batch, seqlen_q, num_heads, _ = q.shape
    seqlen_k = k.shape[1]
    out = _new_output(q)
    lse = _new_output(q, (batch, num_heads, seqlen_q), torch.float32)
    probs = _new_probs(q, (batch, num_heads, seqlen_q, seqlen_k)) if return_probs else None
    seed, offset = _philox_state(q.device, batch * num_heads) if dropout_p > 0 else (0, 0)
    params = _ffi.FwdParams()
    _fill_forward(params, q, k, v, out, lse, probs, batch=batch, seqlen_q=seqlen_q,
                  seqlen_k=seqlen_k, varlen=False, cu_seqlens_q=None, cu_seqlens_k=None,
                  seqused_k=None, dropout_p=dropout_p, softmax_scale=softmax_scale,
                  window_left=window_left, window_right=window_right, softcap=softcap,
                  alibi_slopes=alibi_slopes, seed=seed, offset=offset)
    return params, out, lse, probs, seed, offset, copies


fwd = torch.library.custom_op("tileattn::fwd", mutates_args=())(_fwd_impl)


@fwd.register_fake
def _(q, k, v, dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes,
      return_probs, deterministic):
    batch, seqlen_q, num_heads, _ = q.shape
    seqlen_k = k.shape[1]
    out = q.new_empty(q.shape)
    lse = q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)
    probs = q.new_empty((batch, num_heads, seqlen_q, seqlen_k) if return_probs else (0,),
                        dtype=torch.float32)
    return out, lse, probs, torch.empty((2,), dtype=torch.int64, device="cpu")


def _bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
        dropout_p: float, softmax_scale: float, window_left: int, window_right: int,
        softcap: float, alibi_slopes: Optional[Tensor], deterministic: bool,
        rng_state: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv), contiguous, with q's, k's and v's shapes."""
    params, dq, dk, dv, copies = _bwd_params(
        dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, window_left, window_right,
        softcap, alibi_slopes, deterministic, rng_state)
    _on_device(q.device, backward, params)
    del copies  # alive until the library has read them
    return dq, dk, dv


def _bwd_params(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, window_left,
                window_right, softcap, alibi_slopes, deterministic, rng_state):
    """(params, dq, dk, dv, copies) of one backward; `copies` holds the inputs copied to make a
    last dim contiguous, which params point at (keep it until the call returns)."""
    given = (dout, q, k, v, out, alibi_slopes)
    dout, q, k, v, out, alibi_slopes = (_last_dim_contiguous(x) for x in given)
    copies = tuple(b for a, b in zip(given, (dout, q, k, v, out, alibi_slopes)) if a is not b)
    batch, seqlen_q, _, _ = q.shape
    dq, dk, dv = _new_output(q), _new_output(k), _new_output(v)
    seed, offset = (int(x) % _U64 for x in rng_state.tolist()) if dropout_p > 0 else (0, 0)
    params = _ffi.BwdParams()
    _fill_forward(params.fwd, q, k, v, out, softmax_lse, None, batch=batch, seqlen_q=seqlen_q,
                  seqlen_k=k.shape[1], varlen=False, cu_seqlens_q=None, cu_seqlens_k=None,
                  seqused_k=None, dropout_p=dropout_p, softmax_scale=softmax_scale,
                  window_left=window_left, window_right=window_right, softcap=softcap,
                  alibi_slopes=alibi_slopes, seed=seed, offset=offset)
    _fill_backward(params, dout, dq, dk, dv, deterministic)
    return params, dq, dk, dv, copies


def _bwd_eager(*args):
    """_bwd_impl for the backward that autograd's engine runs eagerly (no tracer: the op path
    runs under one), through a plan per signature (_bwd_plan).  Imported here rather than at
    the top because _bwd_plan builds on this module."""
    from . import _bwd_plan
    return _bwd_plan.backward(*args)


bwd = torch.library.custom_op("tileattn::bwd", mutates_args=())(_bwd_impl)


@bwd.register_fake
def _(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, window_left, window_right,
      softcap, alibi_slopes, deterministic, rng_state):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes, _,
     deterministic) = inputs
    out, lse, _, rng_state = output
    ctx.save_for_backward(q, k, v, out, lse, rng_state, alibi_slopes)
    ctx.options = (dropout_p, softmax_scale, window_left, window_right, softcap)
    ctx.deterministic = deterministic


def _fwd_grads(ctx, dout, backward):
    """(dq, dk, dv, None...) for the forward's inputs, computed by `backward` (the op or its
    implementation) from what _fwd_setup_context saved."""
    q, k, v, out, lse, rng_state, alibi_slopes = ctx.saved_tensors
    dropout_p, softmax_scale, window_left, window_right, softcap = ctx.options
    dq, dk, dv = backward(dout, q, k, v, out, lse, dropout_p, softmax_scale, window_left,
                          window_right, softcap, alibi_slopes, ctx.deterministic, rng_state)
    return (dq, dk, dv) + (None,) * 8


def _fwd_backward(ctx, dout, _dlse, _dprobs, _drng):
    return _fwd_grads(ctx, dout, torch.ops.tileattn.bwd)


# ---------------------------------------------------------------------------------------------
# Varlen form: q (total_q, H, D), k/v (total_k, Hk, D), cu_seqlens int32 (B + 1);
# lse (H, total_q); probs (B, H, max_seqlen_q, max_seqlen_k).

def _varlen_fwd_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
               dropout_p: float, softmax_scale: float, window_left: int, window_right: int,
               softcap: float, alibi_slopes: Optional[Tensor], return_probs: bool,
               deterministic: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (out, softmax_lse, attn_probs or an empty tensor, rng_state)."""
    return _op_outputs(q.device, dropout_p, *_varlen_fwd_run(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, window_left, window_right, softcap, alibi_slopes, return_probs))


def _varlen_fwd_run(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                    dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                    return_probs):
    """The varlen forward's launch: (out, lse, probs or None, philox seed, philox offset)."""
    params, out, lse, probs, seed, offset, copies = _varlen_fwd_params(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, window_left, window_right, softcap, alibi_slopes, return_probs)
    _on_device(q.device, _ffi.library().forward, params)
    del copies  # alive until the library has read them
    return out, lse, probs, seed, offset


def _varlen_fwd_params(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                       max_seqlen_k, dropout_p, softmax_scale, window_left, window_right, softcap,
                       alibi_slopes, return_probs):
    """(params, out, lse, probs or None, seed, offset, copies) of one varlen forward, as
    _fwd_params."""
    given = (q, k, v, alibi_slopes)
    q, k, v, alibi_slopes = (_last_dim_contiguous(x) for x in given)
    copies = tuple(b for a, b in zip(given, (q, k, v, alibi_slopes)) if a is not b)
    batch = cu_seqlens_q.shape[0] - 1
    total_q, num_heads, _ = q.shape
    out = _new_output(q)
    lse = _new_output(q, (num_heads, total_q), torch.float32)
    probs = _new_probs(q, (batch, num_heads, max_seqlen_q, max_seqlen_k)) if return_probs else None
    seed, offset = _philox_state(q.device, batch * num_heads) if dropout_p > 0 else (0, 0)
    params = _ffi.FwdParams()
    _fill_forward(params, q, k, v, out, lse, probs, batch=batch, seqlen_q=max_seqlen_q,
                  seqlen_k=max_seqlen_k, varlen=True, cu_seqlens_q=cu_seqlens_q,
                  cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, dropout_p=dropout_p,
                  softmax_scale=softmax_scale, window_left=window_left,
                  window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes,
                  seed=seed, offset=offset)
    return params, out, lse, probs, seed, offset, copies


varlen_fwd = torch.library.custom_op("tileattn::varlen_fwd", mutates_args=())(_varlen_fwd_impl)


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
      softmax_scale, window_left, window_right, softcap, alibi_slopes, return_probs,
      deterministic):
    batch = cu_seqlens_q.shape[0] - 1
    total_q, num_heads, _ = q.shape
    out = q.new_empty(q.shape)
    lse = q.new_empty((num_heads, total_q), dtype=torch.float32)
    probs = q.new_empty((batch, num_heads, max_seqlen_q, max_seqlen_k) if return_probs else (0,),
                        dtype=torch.float32)
    return out, lse, probs, torch.empty((2,), dtype=torch.int64, device="cpu")


def _varlen_bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor],
               max_seqlen_q: int, max_seqlen_k: int, dropout_p: float, softmax_scale: float,
               window_left: int, window_right: int, softcap: float,
               alibi_slopes: Optional[Tensor], deterministic: bool,
               rng_state: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv), contiguous, with q's, k's and v's shapes."""
    params, dq, dk, dv, copies = _varlen_bwd_params(
        dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes,
        deterministic, rng_state)
    _on_device(q.device, backward, params)
    del copies  # alive until the library has read them
    return dq, dk, dv


def _varlen_bwd_params(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                       max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, window_left,
                       window_right, softcap, alibi_slopes, deterministic, rng_state):
    """(params, dq, dk, dv, copies) of one varlen backward, as _bwd_params."""
    given = (dout, q, k, v, out, alibi_slopes)
    dout, q, k, v, out, alibi_slopes = (_last_dim_contiguous(x) for x in given)
    copies = tuple(b for a, b in zip(given, (dout, q, k, v, out, alibi_slopes)) if a is not b)
    dq, dk, dv = _new_output(q), _new_output(k), _new_output(v)
    seed, offset = (int(x) % _U64 for x in rng_state.tolist()) if dropout_p > 0 else (0, 0)
    params = _ffi.BwdParams()
    _fill_forward(params.fwd, q, k, v, out, softmax_lse, None, batch=cu_seqlens_q.shape[0] - 1,
                  seqlen_q=max_seqlen_q, seqlen_k=max_seqlen_k, varlen=True,
                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                  dropout_p=dropout_p, softmax_scale=softmax_scale, window_left=window_left,
                  window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes,
                  seed=seed, offset=offset)
    _fill_backward(params, dout, dq, dk, dv, deterministic)
    return params, dq, dk, dv, copies


def _varlen_bwd_eager(*args):
    """_varlen_bwd_impl for autograd's eager backward, through _bwd_plan (as _bwd_eager)."""
    from . import _bwd_plan
    return _bwd_plan.varlen_backward(*args)


varlen_bwd = torch.library.custom_op("tileattn::varlen_bwd", mutates_args=())(_varlen_bwd_impl)


@varlen_bwd.register_fake
def _(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
      max_seqlen_k, dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes,
      deterministic, rng_state):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_fwd_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
     softmax_scale, window_left, window_right, softcap, alibi_slopes, _,
     deterministic) = inputs
    out, lse, _, rng_state = output
    ctx.save_for_backward(q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k,
                          alibi_slopes)
    ctx.options = (max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, window_left,
                   window_right, softcap)
    ctx.deterministic = deterministic


def _varlen_fwd_grads(ctx, dout, backward):
    (q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k,
     alibi_slopes) = ctx.saved_tensors
    (max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, window_left, window_right,
     softcap) = ctx.options
    dq, dk, dv = backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes,
        ctx.deterministic, rng_state)
    return (dq, dk, dv) + (None,) * 13


def _varlen_fwd_backward(ctx, dout, _dlse, _dprobs, _drng):
    return _varlen_fwd_grads(ctx, dout, torch.ops.tileattn.varlen_bwd)


def _no_double_backward(ctx, *grads):
    raise RuntimeError("tileattn: the backward of attention is not differentiable "
                       "(double backward is not supported)")


def _no_setup(ctx, inputs, output):
    pass


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)
varlen_fwd.register_autograd(_varlen_fwd_backward, setup_context=_varlen_fwd_setup_context)
bwd.register_autograd(_no_double_backward, setup_context=_no_setup)
varlen_bwd.register_autograd(_no_double_backward, setup_context=_no_setup)



# ---------------------------------------------------------------------------------------------
# CUDA scratch for the backward and the decode (_kvcache_ops.py), from torch's allocator.

def _with_workspace(params, on_cuda, size_of, call, workspace_bytes, like=None):
    """`call(params)` with the CUDA scratch from torch's allocator (of `workspace_bytes`, or of
    the size `size_of(params)` gives), on the current device, or by `like.new_empty` when the
    caller knows `like` is there (the plans: about half the cost of a torch.empty that names the
    device, ~1.5 us on the CI host).  The library's own stream-ordered pool is not used here: on
    the H200 every CUDA-graph capture of a decode call that took scratch from it added ~5.5 us of
    GPU time to each later eager call, for good (1 x 2k: 39 us -> 127 us after 16 captures, also
    after the graphs were freed), and a GQA backward's ~20 us (session 22).  torch's allocator
    knows about graphs -- a capture allocates from the graph's private pool -- and the block it
    hands out here is stream-ordered on the call's stream.  Returns the size, for a plan."""
    workspace = None
    if on_cuda:
        if workspace_bytes is None:
            workspace_bytes = size_of(params)
        if workspace_bytes:
            workspace = (like.new_empty((workspace_bytes,), dtype=torch.uint8) if like is not None
                         else torch.empty(workspace_bytes, dtype=torch.uint8,
                                          device=torch.device("cuda", torch.cuda.current_device())))
            params.workspace, params.workspace_bytes = workspace.data_ptr(), workspace_bytes
    call(params)
    return workspace_bytes


def backward(params, workspace_bytes=None):
    lib = _ffi.library()
    return _with_workspace(params, params.fwd.device == _ffi.DEVICE_CUDA,
                           lib.backward_workspace_size, lib.backward, workspace_bytes)


# ---------------------------------------------------------------------------------------------
# Eager calls skip the custom-op dispatch, which costs ~20 us (this machine) to ~60 us (the H200
# host) per call without autograd and ~100 us more with it (docs/perf-log.md): a call autograd
# does not record runs the op's implementation directly, and one it records runs a plain
# torch.autograd.Function over the same implementations, with the op's own context and backward
# formula.  Anything that traces -- dynamo, a dispatch mode such as FakeTensorMode or make_fx,
# functorch transforms, tensor subclasses -- goes through the op.

def _traced(tensors):
    return (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._functorch.peek_interpreter_stack() is not None
            or any(t is not None and type(t) is not torch.Tensor for t in tensors))


def _recorded(tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _dispatch_needed(*tensors):
    return _traced(tensors) or _recorded(tensors)


def _eager_function(name, impl, setup_context, grads, backward_op, backward_impl):
    """A torch.autograd.Function running `impl` with the op's context and backward formula.

    `ctx` comes into forward (the older form) rather than through a separate setup_context:
    with setup_context defined, Function.apply binds its arguments with inspect.signature on
    every call, which cost ~50 us per forward on the 2-core CI host (docs/perf-log.md)."""

    def forward(ctx, *inputs):
        output = impl(*inputs)
        setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(*(x for x in output[1:] if x is not None))
        # The backward reads only dout: without this autograd builds a zero gradient for each
        # unused output (lse, probs, rng_state), one more allocation and fill kernel per call.
        ctx.set_materialize_grads(False)
        return output

    def backward(ctx, dout, _dlse, _dprobs, _drng):
        if dout is None:  # no gradient reached `out` (grads are not materialized as zeros)
            return (None,) * len(ctx.needs_input_grad)
        # create_graph=True records the backward: the op then refuses a double backward.
        return grads(ctx, dout, backward_op if torch.is_grad_enabled() else backward_impl)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(backward)})


_EagerFwd = _eager_function("_EagerFwd", _eager_outputs(_fwd_run), _fwd_setup_context, _fwd_grads,
                            torch.ops.tileattn.bwd, _bwd_eager)
_EagerVarlenFwd = _eager_function("_EagerVarlenFwd", _eager_outputs(_varlen_fwd_run),
                                  _varlen_fwd_setup_context,
                                  _varlen_fwd_grads, torch.ops.tileattn.varlen_bwd,
                                  _varlen_bwd_eager)


class _Form:
    """What a recorded forward of one form (batch or varlen) needs from this module: the op's
    setup_context and backward formula, and the backward to run with grad mode on (the op, which
    refuses a double backward) or off (the eager plan path)."""

    def __init__(self, setup_context, grads, backward_op, backward_eager):
        self.setup_context, self.grads = setup_context, grads
        self.backward_op, self.backward_eager = backward_op, backward_eager


class _LaunchedFwd(torch.autograd.Function):
    """A recorded call without dropout or attention probabilities: `launch(q, k, v)` gives (out,
    lse) -- a plan's launch (_fwd_plan.py), or the full path that makes the plan -- and the
    context and backward are the op's (`form`, with `inputs` the op's arguments).  Only `out` is
    an output: the lse is saved, not returned, since each further output cost ~7 us an apply on
    the CI host."""

    @staticmethod
    def forward(ctx, launch, form, q, k, v, inputs):
        out, lse = launch(q, k, v)
        form.setup_context(ctx, inputs, (out, lse, None, _NO_DROPOUT_RNG_STATE))
        ctx.form = form
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, dout):
        if dout is None:
            return (None,) * 6
        form = ctx.form
        dq, dk, dv = form.grads(ctx, dout, form.backward_op if torch.is_grad_enabled()
                                else form.backward_eager)[:3]
        return None, None, dq, dk, dv, None


def _call(op, eager, impl, tensors, args):
    if _traced(tensors):
        return op(*args)
    if _recorded(tensors):
        return eager.apply(*args)
    return impl(*args)


_fwd_direct = _direct(_fwd_run)
_varlen_fwd_direct = _direct(_varlen_fwd_run)


_BATCH = _Form(_fwd_setup_context, _fwd_grads, torch.ops.tileattn.bwd, _bwd_eager)
_VARLEN = _Form(_varlen_fwd_setup_context, _varlen_fwd_grads, torch.ops.tileattn.varlen_bwd,
                _varlen_bwd_eager)


def _planned_call(form, params_of, q, k, v, options, on_success):
    """An eager call whose parameters `on_success(params, lse, recorded, options)` sees once the
    library accepted them (when it copied no input), recorded through _LaunchedFwd or not: (out,
    lse or None, None, None).  `options`: the op's arguments after q, k, v; `params_of(q, k,
    v)`: the full path's (params, out, lse, copies)."""
    recorded = _recorded((q, k, v))

    def launch(q, k, v):
        params, out, lse, copies = params_of(q, k, v)
        _on_device(q.device, _ffi.library().forward, params)
        if not copies:
            on_success(params, lse, recorded, options)
        return out, lse

    if recorded:
        return _LaunchedFwd.apply(launch, form, q, k, v, (q, k, v, *options)), None, None, None
    return (*launch(q, k, v), None, None)


def _plannable(on_success, dropout_p, return_probs, tensors):
    return not (on_success is None or dropout_p != 0 or return_probs or _traced(tensors))


def call_fwd(q, k, v, *options, on_success=None):
    """`on_success(params, lse, recorded, options)`, when given, sees the parameters of an eager
    call (one no tracer sees) without dropout or attention probabilities, after the library
    accepted them, with whether autograd records the call (_fwd_plan keeps them for the next call
    with the same signature).  Such a call that autograd records returns (out, None, None,
    None)."""
    if not _plannable(on_success, options[0], options[-2], (q, k, v)):
        return _call(torch.ops.tileattn.fwd, _EagerFwd, _fwd_direct, (q, k, v), (q, k, v, *options))

    def params_of(q, k, v):
        params, out, lse, _, _, _, copies = _fwd_params(q, k, v, *options[:-1])
        return params, out, lse, copies

    return _planned_call(_BATCH, params_of, q, k, v, options, on_success)


def call_varlen_fwd(q, k, v, *options, on_success=None):
    """As call_fwd, for the varlen form (options from cu_seqlens_q on)."""
    if not _plannable(on_success, options[5], options[-2], (q, k, v)):
        return _call(torch.ops.tileattn.varlen_fwd, _EagerVarlenFwd, _varlen_fwd_direct,
                     (q, k, v), (q, k, v, *options))

    def params_of(q, k, v):
        params, out, lse, _, _, _, copies = _varlen_fwd_params(q, k, v, *options[:-1])
        return params, out, lse, copies

    return _planned_call(_VARLEN, params_of, q, k, v, options, on_success)
