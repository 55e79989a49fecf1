"""ctypes binding to libtileattn's C ABI (include/tileattn/tileattn.h).

The library links neither libtorch nor Python, so this one file is the whole binding: it mirrors
the two parameter structs field for field, checks the mirror against the library's own sizes and
ABI version when the library is loaded, and turns error codes into Python exceptions that carry
the library's message and the name of the offending argument.  docs/python-binding.md gives the
measured reason for ctypes over a compiled extension.
"""

import ctypes
import os
import threading
from pathlib import Path

ABI_VERSION = 4  # TILEATTN_ABI_VERSION this mirror was written against

# tileattn_dtype / tileattn_device / tileattn_status
FLOAT16, BFLOAT16, FLOAT32 = 0, 1, 2
DEVICE_CPU, DEVICE_CUDA = 0, 1
OK, INVALID_ARGUMENT, DTYPE, UNSUPPORTED, NOT_BUILT, INTERNAL = range(6)

_i32, _i64, _u64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
_f32, _ptr = ctypes.c_float, ctypes.c_void_p
_enum = ctypes.c_int  # C enums with small values are int-sized on every ABI we target


class FwdParams(ctypes.Structure):
    """Mirror of tileattn_fwd_params; field order and types must match the header exactly."""

    _fields_ = [
        ("q", _ptr), ("k", _ptr), ("v", _ptr),
        ("q_batch_stride", _i64), ("q_row_stride", _i64), ("q_head_stride", _i64),
        ("k_batch_stride", _i64), ("k_row_stride", _i64), ("k_head_stride", _i64),
        ("v_batch_stride", _i64), ("v_row_stride", _i64), ("v_head_stride", _i64),
        ("out", _ptr),
        ("out_batch_stride", _i64), ("out_row_stride", _i64), ("out_head_stride", _i64),
        ("softmax_lse", _ptr),
        ("lse_batch_stride", _i64), ("lse_head_stride", _i64),
        ("attn_probs", _ptr),
        ("probs_batch_stride", _i64), ("probs_head_stride", _i64), ("probs_row_stride", _i64),
        ("batch", _i32), ("seqlen_q", _i32), ("seqlen_k", _i32),
        ("num_heads", _i32), ("num_heads_k", _i32), ("head_dim", _i32),
        ("cu_seqlens_q", _ptr), ("cu_seqlens_k", _ptr), ("seqused_k", _ptr),
        ("total_q", _i64), ("total_k", _i64),
        ("softmax_scale", _f32),
        ("window_left", _i32), ("window_right", _i32),
        ("softcap", _f32),
        ("alibi_slopes", _ptr),
        ("alibi_batch_stride", _i64),
        ("dropout_p", _f32),
        ("philox_seed", _u64), ("philox_offset", _u64),
        ("dtype", _enum),
        ("device", _enum),
        ("stream", _ptr),
        ("num_threads", _i32),
    ]


class BwdParams(ctypes.Structure):
    """Mirror of tileattn_bwd_params."""

    _fields_ = [
        ("fwd", FwdParams),
        ("dout", _ptr),
        ("dout_batch_stride", _i64), ("dout_row_stride", _i64), ("dout_head_stride", _i64),
        ("dq", _ptr),
        ("dq_batch_stride", _i64), ("dq_row_stride", _i64), ("dq_head_stride", _i64),
        ("dk", _ptr),
        ("dk_batch_stride", _i64), ("dk_row_stride", _i64), ("dk_head_stride", _i64),
        ("dv", _ptr),
        ("dv_batch_stride", _i64), ("dv_row_stride", _i64), ("dv_head_stride", _i64),
        ("deterministic", _i32),
        ("workspace", _ptr), ("workspace_bytes", _i64),
    ]


class KvCacheParams(ctypes.Structure):
    """Mirror of tileattn_kvcache_params."""

    _fields_ = [
        ("fwd", FwdParams),
        ("cache_seqlens", _ptr), ("cache_batch_idx", _ptr), ("cache_leftpad", _ptr),
        ("block_table", _ptr),
        ("block_table_batch_stride", _i64),
        ("num_cache_entries", _i32),
        ("num_blocks", _i32), ("page_size", _i32), ("max_blocks", _i32),
        ("k_new", _ptr), ("v_new", _ptr),
        ("k_new_batch_stride", _i64), ("k_new_row_stride", _i64), ("k_new_head_stride", _i64),
        ("v_new_batch_stride", _i64), ("v_new_row_stride", _i64), ("v_new_head_stride", _i64),
        ("seqlen_new", _i32),
        ("rotary_cos", _ptr), ("rotary_sin", _ptr),
        ("rotary_dim", _i32), ("rotary_seqlen", _i32), ("rotary_interleaved", _i32),
        ("num_splits", _i32),
        ("workspace", _ptr), ("workspace_bytes", _i64),
        ("max_seqlen_k", _i32),
        ("uniform_cache_seqlen", _i32), ("cache_seqlen", _i32),
    ]


class TileattnError(Exception):
    """Base of the errors raised for a rejected call.  `argument` names what was wrong (a Python
    argument name such as "k", or the library's parameter name such as "window_left")."""

    def __init__(self, message, argument=None):
        super().__init__(message)
        self.argument = argument


class InvalidArgumentError(TileattnError, ValueError):
    """A value, shape, stride or option is wrong (TILEATTN_ERROR_INVALID_ARGUMENT)."""


class DtypeError(TileattnError, TypeError):
    """A dtype is wrong or unsupported for this backend (TILEATTN_ERROR_DTYPE)."""


class BackendError(TileattnError, RuntimeError):
    """Valid, but this build or device cannot run it: unsupported, not built, or internal."""


_STATUS_ERRORS = {
    INVALID_ARGUMENT: InvalidArgumentError,
    DTYPE: DtypeError,
    UNSUPPORTED: BackendError,
    NOT_BUILT: BackendError,
    INTERNAL: BackendError,
}


def _library_path():
    env = os.environ.get("TILEATTN_LIBRARY")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "libtileattn.so"


class _Library:
    """The loaded libtileattn with argument types declared once."""

    def __init__(self, path):
        if not path.is_file():
            raise ImportError(
                f"tileattn: the core library {path} is missing. Install the package with "
                "`pip install .` from the repository, or point TILEATTN_LIBRARY at a "
                "libtileattn.so built by CMake (build/src/libtileattn.so)."
            )
        lib = ctypes.CDLL(str(path))
        self.path = path
        lib.tileattn_forward.argtypes = [ctypes.POINTER(FwdParams)]
        lib.tileattn_forward.restype = ctypes.c_int
        lib.tileattn_backward.argtypes = [ctypes.POINTER(BwdParams)]
        lib.tileattn_backward.restype = ctypes.c_int
        lib.tileattn_forward_kvcache.argtypes = [ctypes.POINTER(KvCacheParams)]
        lib.tileattn_forward_kvcache.restype = ctypes.c_int
        lib.tileattn_kvcache_workspace_size.argtypes = [ctypes.POINTER(KvCacheParams),
                                                        ctypes.POINTER(ctypes.c_int64)]
        lib.tileattn_kvcache_workspace_size.restype = ctypes.c_int
        lib.tileattn_backward_workspace_size.argtypes = [ctypes.POINTER(BwdParams),
                                                         ctypes.POINTER(ctypes.c_int64)]
        lib.tileattn_backward_workspace_size.restype = ctypes.c_int
        for name in ("tileattn_last_error", "tileattn_last_error_argument"):
            getattr(lib, name).argtypes = []
            getattr(lib, name).restype = ctypes.c_char_p
        for name in ("tileattn_abi_version", "tileattn_has_cuda"):
            getattr(lib, name).argtypes = []
            getattr(lib, name).restype = ctypes.c_int
        for name in ("tileattn_fwd_params_size", "tileattn_bwd_params_size",
                     "tileattn_kvcache_params_size"):
            getattr(lib, name).argtypes = []
            getattr(lib, name).restype = ctypes.c_int64

        abi = lib.tileattn_abi_version()
        if abi != ABI_VERSION:
            raise ImportError(
                f"tileattn: {path} has ABI version {abi}, this Python package expects "
                f"{ABI_VERSION}; rebuild the library and the package from one checkout"
            )
        for struct, size_fn in ((FwdParams, lib.tileattn_fwd_params_size),
                                (BwdParams, lib.tileattn_bwd_params_size),
                                (KvCacheParams, lib.tileattn_kvcache_params_size)):
            if ctypes.sizeof(struct) != size_fn():
                raise ImportError(
                    f"tileattn: ctypes mirror {struct.__name__} is {ctypes.sizeof(struct)} bytes "
                    f"but {path} says {size_fn()}; python/tileattn/_ffi.py is out of date"
                )
        self.has_cuda = bool(lib.tileattn_has_cuda())
        # Bound C functions, looked up once: attribute access on a CDLL costs ~0.2 us a call.
        self._forward = lib.tileattn_forward
        self._backward = lib.tileattn_backward
        self._forward_kvcache = lib.tileattn_forward_kvcache
        self._kvcache_workspace_size = lib.tileattn_kvcache_workspace_size
        self._backward_workspace_size = lib.tileattn_backward_workspace_size
        self._last_error = lib.tileattn_last_error
        self._last_error_argument = lib.tileattn_last_error_argument

    def _raise(self, status):
        message = (self._last_error() or b"").decode(errors="replace")
        argument = (self._last_error_argument() or b"").decode(errors="replace") or None
        if argument and argument not in message:
            message = f"{argument}: {message}"
        error = _STATUS_ERRORS.get(status, BackendError)
        raise error(f"tileattn: {message or f'error code {status}'}", argument)

    def forward(self, params):
        status = self._forward(ctypes.byref(params))
        if status != OK:
            self._raise(status)

    def backward(self, params):
        status = self._backward(ctypes.byref(params))
        if status != OK:
            self._raise(status)

    def forward_kvcache(self, params):
        status = self._forward_kvcache(ctypes.byref(params))
        if status != OK:
            self._raise(status)

    def kvcache_workspace_size(self, params):
        return self._size(self._kvcache_workspace_size, params)

    def backward_workspace_size(self, params):
        return self._size(self._backward_workspace_size, params)

    def _size(self, function, params):
        size = ctypes.c_int64()
        status = function(ctypes.byref(params), ctypes.byref(size))
        if status != OK:
            self._raise(status)
        return size.value


_lock = threading.Lock()
_library = None


def library():
    """The process-wide library, loaded on first use (so `import tileattn` never fails on a
    missing library; the first call says what is missing)."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                _library = _Library(_library_path())
    return _library
