"""The clock64() stamps of a trace build (scripts/fwd_trace, scripts/bwd_trace): each build exports
`int READER(void* dst, size_t bytes)`, which copies its device array out, or zeroes it when dst is
null (before the traced call, so a step a role skips reads 0, not a stale stamp)."""
import ctypes

import numpy as np


def zero(reader, shape):
    reader(None, ctypes.c_size_t(int(np.prod(shape)) * 8))


def read(reader, shape):
    """The stamps as int64 of `shape`; exits if the copy fails."""
    buf = np.zeros(shape, dtype=np.uint64)
    if reader(ctypes.c_void_p(buf.ctypes.data), ctypes.c_size_t(buf.nbytes)) != 0:
        raise SystemExit(f"{reader.__name__} failed")
    return buf.astype(np.int64)


def med(values):
    """The median of a list of cycle counts, formatted, or '-' for none."""
    return f"{np.median(values):.0f}" if len(values) else "-"
