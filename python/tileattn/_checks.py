"""Argument checks the flash_attn_* functions run before anything is allocated or launched.

The library validates every call again (and checks device-side contents such as cu_seqlens on
the CPU backend); checking here too gives messages in the user's own argument names ("kv", not
"k_row_stride") and catches the classic layout mistake: tensors in SDPA's (B, H, S, D) order
passed where flash-attn expects (B, S, H, D).  Every check reads shapes only, never values, so
nothing here syncs with a device.
"""

import math

import torch

from ._ffi import BackendError, DtypeError, InvalidArgumentError

_HALF = (torch.float16, torch.bfloat16)
INT32_MAX = 2**31 - 1  # the library's sizes, windows and counts are int32 (include/tileattn/tileattn.h)
MAX_HEAD_DIM = 256
# The library holds softmax_scale and softcap as float32.  A positive value below float32's
# smallest normal number would reach it as 0 or a subnormal (0 means "the default scale", and a
# softcap of 0 is "off"; the kernels flush subnormals to 0), one above its largest as inf.
_FLOAT32_MIN_NORMAL = 2.0 ** -126
_FLOAT32_MAX = (2 - 2.0 ** -23) * 2.0 ** 127
_SDPA_HINT = (". This looks like PyTorch SDPA's (batch, nheads, seqlen, headdim) layout; "
              "flash-attn functions take (batch, seqlen, nheads, headdim): pass "
              "q.transpose(1, 2) etc.")


class Checker:
    """Collects the function name so every message reads "flash_attn_func: k: ..."."""

    def __init__(self, function):
        self.function = function

    def fail(self, error, argument, message):
        raise error(f"{self.function}: {argument}: {message}", argument)

    def tensor(self, x, name):
        if not isinstance(x, torch.Tensor):
            self.fail(DtypeError, name, f"expected a torch.Tensor, got {type(x).__name__}")

    def dims(self, x, name, ndim, layout):
        self.tensor(x, name)
        if x.dim() != ndim:
            self.fail(InvalidArgumentError, name,
                      f"expected {ndim} dimensions {layout}, got shape {tuple(x.shape)}")

    def dtype_and_device(self, tensors):
        """`tensors`: (name, tensor) pairs that must share q's dtype and device."""
        name0, x0 = tensors[0]
        if x0.dtype not in _HALF and not (x0.dtype == torch.float32 and x0.device.type == "cpu"):
            self.fail(DtypeError, name0,
                      f"dtype {x0.dtype} is not supported; use torch.float16 or torch.bfloat16 "
                      "(torch.float32 on the CPU backend)")
        if x0.device.type not in ("cpu", "cuda"):
            self.fail(BackendError, name0,
                      f"tensors on device '{x0.device}' have no tileattn backend; use CPU or "
                      "CUDA tensors")
        for name, x in tensors[1:]:
            if x.dtype != x0.dtype:
                self.fail(DtypeError, name, f"dtype {x.dtype} differs from {name0}'s {x0.dtype}")
            if x.device != x0.device:
                self.fail(InvalidArgumentError, name,
                          f"is on {x.device} but {name0} is on {x0.device}")

    def options(self, dropout_p, softmax_scale, window_size, softcap, head_dim):
        """Returns (dropout_p, softmax_scale, window_left, window_right, softcap) as plain
        Python numbers (causal is applied by the caller)."""
        if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
            self.fail(InvalidArgumentError, "dropout_p", f"must be in [0, 1), got {dropout_p!r}")
        if softmax_scale is None:
            softmax_scale = head_dim ** -0.5
        elif (not isinstance(softmax_scale, (int, float)) or not softmax_scale > 0
              or math.isinf(softmax_scale)):
            self.fail(InvalidArgumentError, "softmax_scale",
                      f"must be a finite positive float or None, got {softmax_scale!r}")
        elif not _FLOAT32_MIN_NORMAL <= softmax_scale <= _FLOAT32_MAX:
            self.fail(InvalidArgumentError, "softmax_scale",
                      f"{softmax_scale!r} is outside float32's normal range "
                      f"[{_FLOAT32_MIN_NORMAL:.4g}, {_FLOAT32_MAX:.4g}], in which tileattn holds it")
        if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
                or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
            self.fail(InvalidArgumentError, "window_size",
                      f"must be a (left, right) pair of ints, got {window_size!r}")
        left, right = window_size
        if left < -1 or right < -1:
            self.fail(InvalidArgumentError, "window_size",
                      f"entries must be >= 0, or -1 for unbounded; got {tuple(window_size)}")
        # The library holds windows in 32 bits.  A window of INT32_MAX is already wider than any
        # sequence, so a larger one means the same and is clamped rather than let wrap around.
        left, right = min(left, INT32_MAX), min(right, INT32_MAX)
        if not isinstance(softcap, (int, float)) or not softcap >= 0 or math.isinf(softcap):
            self.fail(InvalidArgumentError, "softcap", f"must be finite and >= 0 (0 = off), got {softcap!r}")
        if softcap != 0 and not _FLOAT32_MIN_NORMAL <= softcap <= _FLOAT32_MAX:
            self.fail(InvalidArgumentError, "softcap",
                      f"{softcap!r} is outside float32's normal range "
                      f"[{_FLOAT32_MIN_NORMAL:.4g}, {_FLOAT32_MAX:.4g}], in which tileattn holds it "
                      "(0 turns softcap off)")
        return float(dropout_p), float(softmax_scale), left, right, float(softcap)

    def heads(self, q, k, v, names, seq_dim):
        """Shapes of q, k, v in flash-attn's layout; `seq_dim` is 1 for (B, S, H, D) and 0 for
        the packed (total, H, D) form.  Mentions SDPA's layout when the shapes would fit it."""
        nq, nk, nv = names
        head_dim = q.shape[-1]
        batch_form = seq_dim == 1

        def hint():
            # Under SDPA's reading dims 1 and 2 swap roles (heads first); the hint is added to a
            # failure only when that reading fits the shapes.
            fits_sdpa = (batch_form and k.shape == v.shape and q.shape[0] == k.shape[0]
                         and q.shape[-1] == k.shape[-1] and k.shape[1] > 0
                         and q.shape[1] % k.shape[1] == 0)
            return _SDPA_HINT if fits_sdpa else ""

        if batch_form and k.shape[0] != q.shape[0]:
            self.fail(InvalidArgumentError, nk,
                      f"batch size {k.shape[0]} differs from {nq}'s {q.shape[0]}")
        for name, x in ((nk, k), (nv, v)):
            if x.shape[-1] != head_dim:
                self.fail(InvalidArgumentError, name,
                          f"head dim {x.shape[-1]} differs from {nq}'s {head_dim} "
                          f"(shapes {tuple(q.shape)} and {tuple(x.shape)})")
        if v.shape != k.shape:
            self.fail(InvalidArgumentError, nv,
                      f"shape {tuple(v.shape)} differs from {nk}'s {tuple(k.shape)}" + hint())
        if head_dim == 0:
            self.fail(InvalidArgumentError, nq, f"head dim is 0 (shape {tuple(q.shape)})")
        if head_dim > MAX_HEAD_DIM:
            self.fail(InvalidArgumentError, nq,
                      f"head dim {head_dim} is above the {MAX_HEAD_DIM} tileattn supports (shape {tuple(q.shape)})")
        num_heads, num_heads_k = q.shape[-2], k.shape[-2]
        if num_heads == 0:
            self.fail(InvalidArgumentError, nq, f"has 0 heads (shape {tuple(q.shape)})")
        if num_heads_k == 0 or num_heads % num_heads_k != 0:
            self.fail(InvalidArgumentError, nk,
                      f"{num_heads_k} heads must divide {nq}'s {num_heads} "
                      f"heads (shapes {tuple(q.shape)} and {tuple(k.shape)})" + hint())

    def alibi(self, alibi_slopes, batch, num_heads, device, sdpa_heads=None):
        if alibi_slopes is None:
            return None
        self.tensor(alibi_slopes, "alibi_slopes")
        if alibi_slopes.dtype != torch.float32:
            self.fail(DtypeError, "alibi_slopes", f"must be float32, got {alibi_slopes.dtype}")
        if alibi_slopes.device != device:
            self.fail(InvalidArgumentError, "alibi_slopes",
                      f"is on {alibi_slopes.device} but q is on {device}")
        shape = tuple(alibi_slopes.shape)
        if shape not in ((num_heads,), (batch, num_heads)):
            hint = (_SDPA_HINT if sdpa_heads is not None and shape[-1:] == (sdpa_heads,)
                    else "")
            self.fail(InvalidArgumentError, "alibi_slopes",
                      f"shape {shape} must be (nheads,) = ({num_heads},) or (batch, nheads) = "
                      f"({batch}, {num_heads})" + hint)
        return alibi_slopes

    def int32_tensor(self, x, name, device, shape=None):
        """An index tensor: int32, on q's device, and of `shape` when one is given."""
        self.tensor(x, name)
        if x.dtype != torch.int32:
            self.fail(DtypeError, name, f"must be int32, got {x.dtype}")
        if x.device != device:
            self.fail(InvalidArgumentError, name, f"is on {x.device} but q is on {device}")
        if shape is not None and tuple(x.shape) != shape:
            self.fail(InvalidArgumentError, name, f"shape {tuple(x.shape)} must be {shape}")

    def cu_seqlens(self, x, name, device, batch=None, first_name=None):
        self.int32_tensor(x, name, device)
        if x.dim() != 1 or x.shape[0] < 2:
            self.fail(InvalidArgumentError, name,
                      "must be 1-D (batch_size + 1,) with batch_size >= 1, got shape "
                      f"{tuple(x.shape)}")
        if batch is not None and x.shape[0] != batch + 1:
            self.fail(InvalidArgumentError, name,
                      f"has {x.shape[0]} entries but {first_name} has {batch + 1}")
        return x if x.is_contiguous() else x.contiguous()

    def seqused_k(self, x, batch, device):
        if x is None:
            return None
        self.int32_tensor(x, "seqused_k", device, (batch,))
        return x.contiguous()

    def seqlen(self, value, name):
        # A SymInt from torch.compile is fine too; only plain values are range-checked.
        return value if isinstance(value, torch.SymInt) else self.int32(value, name, 1)

    def int32(self, value, name, minimum):
        """A plain int argument the library holds in 32 bits, in [minimum, INT32_MAX]."""
        if (not isinstance(value, int) or isinstance(value, bool)
                or not minimum <= value <= INT32_MAX):
            self.fail(InvalidArgumentError, name,
                      f"must be an int in [{minimum}, 2**31 - 1], got {value!r}")
        return value

