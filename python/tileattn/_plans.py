"""What the repeat-call fast paths (_kvcache_plan.py, _fwd_plan.py, _bwd_plan.py) share: a
call's signature is everything the Python checks and the parameter struct depend on except data
pointers and the stream; a plan is the struct of an earlier accepted call with that signature,
which the next such call copies and fills with its own pointers.  The library validates the
struct on every call, so a plan skips only Python-side checks that an identical signature
already passed."""

import torch

from . import _ffi, _ops


def tensor_key(x):
    # type and requires_grad too: plans exist only for plain tensors that autograd need not see
    return None if x is None else (type(x), x.shape, x.stride(), x.dtype, x.device, x.requires_grad)


def traced():
    """What _ops._traced checks beyond dynamo (signatures are None under it) and the tensors'
    types (signatures hold them): a dispatch mode such as make_fx, or a functorch transform."""
    return (torch._C._len_torch_dispatch_stack() > 0
            or torch._C._functorch.peek_interpreter_stack() is not None)


def on_other_device(x):
    """Whether CUDA tensor `x` is on another device than the current one: the full path switches
    to it, while a plan's call would launch on the current one."""
    return x.device.index != torch.cuda.current_device()


def fill_call(fwd, on_cuda, q, k, v, out, lse, alibi_slopes):
    """The per-call fields of a plan's copied FwdParams: the data pointers, and the current
    stream (CUDA) or the thread count (CPU).  The signature fixes whether alibi_slopes is given,
    so an absent one stays 0 from the plan."""
    fwd.q, fwd.k, fwd.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
    fwd.out, fwd.softmax_lse = out.data_ptr(), lse.data_ptr()
    if alibi_slopes is not None:
        fwd.alibi_slopes = alibi_slopes.data_ptr()
    if on_cuda:
        fwd.stream = _ops._current_stream(q.device)
    else:
        fwd.num_threads = torch.get_num_threads()


def call_with_workspace(plans, key, call, params, on_cuda, workspace_bytes, like):
    """`call(params)` with the plan's `workspace_bytes` of CUDA scratch (_ops._with_workspace, on
    `like`'s device, which the plan checked is the current one).  False, with the plan dropped,
    when the library refuses that size: the kernel choice moved under the plan
    (TILEATTN_DECODE_FAMILY changed), and the full path must run."""
    try:
        _ops._with_workspace(params, on_cuda, None, call, workspace_bytes, like)
    except _ffi.InvalidArgumentError as error:
        if error.argument != "workspace":
            raise
        plans.drop(key)
        return False
    return True


def empty_like_shape(tensor):
    """A one-element tensor expanded to `tensor`'s shape: _ops._new_output of it (empty_like)
    allocates a fresh contiguous tensor of that shape, dtype and device in ~1.1 us against
    new_empty's ~1.6 with the shape (CI host), and the plan holds one element, not an output."""
    return tensor.new_empty((1,)).expand(tensor.shape)


class Plans:
    """Plans by signature, at most `limit` of them: a model's layers share one signature per
    shape, a server whose batch or lengths vary adds one per shape, and past the limit the cache
    starts over.  A signature that cannot be hashed (a list option) never has a plan."""

    def __init__(self, limit=64):
        self.limit = limit
        self._plans = {}

    def get(self, key):
        try:
            return self._plans.get(key)
        except TypeError:
            return None

    def store(self, key, plan):
        try:
            hash(key)
        except TypeError:
            return
        if len(self._plans) >= self.limit:
            self._plans.clear()
        self._plans[key] = plan

    def drop(self, key):
        self._plans.pop(key, None)

    def clear(self):
        self._plans.clear()

    def __len__(self):
        return len(self._plans)
