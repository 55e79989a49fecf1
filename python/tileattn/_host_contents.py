"""Whether a call's index tensors (cu_seqlens, seqused_k, block_table, ...) are read on the host.

The CPU backend reads them and raises naming the argument at the first bad entry.  On CUDA they
stay unread: a read waits for the stream, costs a sync per call and cannot be captured into a
CUDA graph, so the kernels turn a bad entry into NaN outputs instead.  TILEATTN_CHECK_CONTENTS=on
brings the CPU's errors to CUDA calls, for debugging: the library copies each call's index arrays
to the host and checks them (src/api/host_index_copy.h), and the package's own content checks
(paged varlen keys) run on CUDA too.  Read on every call, like
the library reads it, so it can be switched between calls.
"""

import os

import torch

from ._ffi import BackendError, InvalidArgumentError

VARIABLE = "TILEATTN_CHECK_CONTENTS"


def read_on_host(device):
    """True where this call's index tensors are to be checked on the host: always on the CPU, on
    CUDA with TILEATTN_CHECK_CONTENTS=on; never while torch.compile traces (the library still
    checks its own arrays when the compiled call runs)."""
    if torch.compiler.is_compiling():
        return False
    if device.type == "cpu":
        return True
    value = os.environ.get(VARIABLE, "")
    if value in ("", "off"):
        return False
    if value != "on":
        raise InvalidArgumentError(f"tileattn: {VARIABLE} must be off or on, got '{value}'", VARIABLE)
    if torch.cuda.is_current_stream_capturing():
        raise BackendError(f"tileattn: {VARIABLE}=on reads each call's index tensors on the host, which "
                           "waits for the stream; a stream being captured into a CUDA graph cannot wait "
                           "(unset it to capture)", VARIABLE)
    return True
