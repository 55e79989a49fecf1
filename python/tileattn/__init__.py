"""tileattn: exact attention (FlashAttention-2) with flash-attn 2.x's Python API.

    import tileattn
    out = tileattn.flash_attn_func(q, k, v, causal=True)

The core is libtileattn, a C library loaded through ctypes; it never links libtorch, so one build
works with every torch >= 2.4.  Set TILEATTN_LIBRARY to use a library built elsewhere (a
development build: build/src/libtileattn.so).
"""

from . import _ops  # noqa: F401  (registers the torch.ops.tileattn custom ops)
from . import interface
from ._ffi import BackendError, DtypeError, InvalidArgumentError, TileattnError
from .interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from .ring import ring_flash_attn_func, ring_flash_attn_varlen_func

__version__ = "0.1.0"


def has_cuda():
    """True when the loaded libtileattn was built with the CUDA backend."""
    from ._ffi import library

    return library().has_cuda


def library_path():
    """Where the loaded libtileattn lives."""
    from ._ffi import library

    return str(library().path)


__all__ = interface.__all__ + [
    "ring_flash_attn_func",
    "ring_flash_attn_varlen_func",
    "has_cuda",
    "library_path",
    "TileattnError",
    "InvalidArgumentError",
    "DtypeError",
    "BackendError",
]
