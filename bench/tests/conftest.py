"""The bench package's own tests: CPU only here (Triton's interpreter runs the FA1 kernel), CUDA too
where a GPU is present.  Run from the repo root: python3 -m pytest -q bench/tests"""
import os

import torch

if not torch.cuda.is_available():
    # Must be set before triton.jit decorates the kernel (at import of bench.fa1_triton).
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET") == "1":
    from triton.runtime import interpreter

    _patch_lang_tensor = interpreter._patch_lang_tensor

    def _patch_with_scalar_index(tensor, scope):
        """Triton 3.6's interpreter turns loop bounds into ints with int(array of shape (1,)),
        which NumPy >= 2.4 refuses; take the one element instead."""
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = _patch_with_scalar_index
