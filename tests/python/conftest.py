"""Shared setup for the Python suite: which devices to run on, per-test random seeds, poisoned
outputs, and FlashAttention's tolerance rule."""

import os
import random
import zlib

import pytest
import torch

import tileattn
from tileattn import _batch_decode_route, _bwd_plan, _fwd_plan, _kvcache_plan, _ops


def _devices():
    """cpu always; cuda when torch sees a GPU and the library has the CUDA backend.
    TILEATTN_TEST_DEVICES=cpu (or cpu,cuda) overrides."""
    chosen = os.environ.get("TILEATTN_TEST_DEVICES")
    if chosen:
        return [d.strip() for d in chosen.split(",") if d.strip()]
    devices = ["cpu"]
    if torch.cuda.is_available() and tileattn.has_cuda():
        devices.append("cuda")
    return devices


DEVICES = _devices()
_SESSION_SEED = int(os.environ.get("TILEATTN_TEST_SEED", random.randrange(1 << 31)))


def pytest_report_header(config):
    return (f"tileattn: library {tileattn.library_path()} (CUDA backend: {tileattn.has_cuda()}); "
            f"torch {torch.__version__}; devices {DEVICES}; TILEATTN_TEST_SEED={_SESSION_SEED}")


def pytest_terminal_summary(terminalreporter, exitstatus):
    # Also under -q, which hides the header: the GPU suite's logs must name the seed of a failure.
    if exitstatus != 0:
        terminalreporter.write_line(f"to reproduce: TILEATTN_TEST_SEED={_SESSION_SEED}")


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES)


def seed_of_test(session_seed, node_id):
    """The torch seed of the test `node_id` in the session of `session_seed` (TILEATTN_TEST_SEED)."""
    return session_seed ^ zlib.crc32(node_id.encode())


@pytest.fixture(autouse=True)
def _fresh_seed_and_poison(request, monkeypatch):
    """Fresh inputs for every test (a seed derived from the session seed and the test's id, so a
    failure reproduces with TILEATTN_TEST_SEED), and every output the package allocates filled
    with NaN before the library writes it."""
    torch.manual_seed(seed_of_test(_SESSION_SEED, request.node.nodeid))
    monkeypatch.setattr(_ops, "poison_outputs", True)


@pytest.fixture
def no_plans():
    """No repeat-call plan before the test or after it (tileattn/_plans.py): the test's first
    call takes the full path, and leaves nothing behind for the next test."""
    def clear():
        for module in (_fwd_plan, _bwd_plan, _kvcache_plan):
            module._plans.clear()
    clear()
    yield
    clear()


@pytest.fixture
def no_decode_route(monkeypatch):
    """flash_attn_func and flash_attn_varlen_func calls shaped like a decode step run as
    flash_attn_with_kvcache calls on CUDA (tileattn/_batch_decode_route.py), whose plans and bits
    are the KV-cache path's; a test of the forward path's own behaviour turns that off."""
    monkeypatch.setattr(_batch_decode_route, "DEVICES", ())


def dtypes_for(device):
    return [torch.bfloat16, torch.float16] + ([torch.float32] if device == "cpu" else [])


def assert_fa_close(name, ours, naive, ref, floor, lse=None, shift=None):
    """FlashAttention's rule: max|ours - ref| <= 2 * max|naive - ref| + floor, where ref is
    float64 and naive is the same computation in the inputs' precision.  Infinite entries (LSE of
    rows that see no key) must match exactly.

    Gradients pass the float64 LSE as `lse`: the backward recomputes P = exp(S - LSE) from the
    float32 LSE the forward saved (flash-attn's contract), and that rounding moves P by up to
    2^-24 |LSE| relative, which the naive computation (softmax in one pass) never pays.  With ALiBi
    or large scores |LSE| reaches the hundreds, so the floor grows by 4 x 2^-24 max|LSE| max|ref|.
    `shift` (attn_reference.backward_rounding_shift) is the part of dq and dk that follows from the
    backward's own roundings (the rounded output it saved, its float32 dP - D); the floor grows by
    its largest entry."""
    ours, naive, ref = (x.detach().double().cpu() for x in (ours, naive, ref))
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(ours).any(), f"{name}: NaN in {int(torch.isnan(ours).sum())} entries"
    infinite = torch.isinf(ref)
    same_inf = (torch.equal(torch.isinf(ours), infinite)
                and torch.equal(ours[infinite], ref[infinite]))
    assert same_inf, f"{name}: infinite entries differ from the reference"
    finite = ~infinite
    if not finite.any():
        return
    if lse is not None:
        lse = lse.detach().double().cpu()
        lse_max = lse[torch.isfinite(lse)].abs().max().item() if torch.isfinite(lse).any() else 0.0
        floor += 4 * 2.0 ** -24 * lse_max * ref[finite].abs().max().item()
    if shift is not None:
        floor += shift.detach().double().cpu().abs().max().item()
    err = (ours[finite] - ref[finite]).abs().max().item()
    base = (naive[finite] - ref[finite]).abs().max().item()
    assert err <= 2 * base + floor, (
        f"{name}: max error {err:.3g} vs float64 exceeds 2 x naive {base:.3g} + {floor:g}")


# Floors of the rule: the naive baseline can be exact by luck on tiny problems, or by structure.
# With one key, P = 1 and dS = P (dP - D) is 0 exactly: autograd's softmax backward returns 0, while
# the FlashAttention backward computes dP and D = rowsum(dO o O) as two float32 dot products whose
# roundings differ by a few float32 ulps, and dk sums 127 query rows of them: 2.0e-5, over the
# former 2e-5 floor (CI, TILEATTN_TEST_SEED=171243702, test_varlen_options[cpu-gqa7]).
FLOOR = {torch.float32: 1e-4, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def cpu_switch_takes(variable, value, dtype=torch.float32):
    """Whether a CPU call runs with the kernel switch `variable` set to `value` (TILEATTN_CPU_AMX=on,
    TILEATTN_CPU_SIMD=avx2), or raises naming it because the CPU lacks the instructions."""
    x = torch.zeros(1, 1, 1, 16, dtype=dtype)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(variable, value)
        try:
            tileattn.flash_attn_func(x, x, x)
        except tileattn.TileattnError as error:
            assert error.argument == variable
            return False
    return True


def rand(*shape, dtype, device, requires_grad=False):
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(requires_grad)


def capture_cuda_graph(step, warm_up=None):
    """(graph, what step() returned while captured): one call of warm_up (default: step) on a
    side stream first, as torch.cuda.graph asks, so that lazy initialization stays out of the
    capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (warm_up or step)()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs
