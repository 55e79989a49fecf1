"""Time one backend on one case: the forward, forward + backward, and backward as their
difference, each the median of timing.RUNS calls after timing.WARMUP."""
from dataclasses import dataclass

import torch

from bench import timing
from bench.environment import free_bytes

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Memory a score-materializing backend needs, in score matrices of B*H*S^2 floats (the brief's
# estimate): the forward keeps one; forward + backward about three (P, dP, dS).
SCORE_MATRICES = {"fwd": 1, "bwd": 3, "fwdbwd": 3}


@dataclass
class Limits:
    max_case_s: float = float("inf")  # skip a (case, backend) whose timed calls would take longer
    memory_fraction: float = 0.8  # of the free device memory a case may plan to use


def make_inputs(case, device, dtype, requires_grad):
    shape = (case.batch, case.seqlen, case.heads, case.headdim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=requires_grad) for _ in range(3))
    return q, k, v, torch.randn(shape, device=device, dtype=dtype)


def memory_skip(backend, case, directions, device, limits):
    if not backend.materializes_scores:
        return None
    need = case.scores_bytes() * max(SCORE_MATRICES[d] for d in directions)
    if need > limits.memory_fraction * free_bytes(device):
        return f"needs ~{need / 2**30:.0f} GiB for B*H*S^2 scores"
    return None


def time_backend(backend, case, directions, device, dtype, limits, runs=timing.RUNS, warmup=timing.WARMUP,
                 queue=1):
    """{direction: ms} for the directions asked, or a string saying why the case was skipped.
    `queue`: calls per timed sample, issued back to back (timing.median_ms)."""
    reason = memory_skip(backend, case, directions, device, limits)
    if reason:
        return reason
    needs_grad = any(d != "fwd" for d in directions)
    q, k, v, dout = make_inputs(case, device, dtype, needs_grad)
    call = backend.make(q, k, v, case.causal)

    def forward():
        with torch.no_grad():
            call()

    def forward_backward():
        q.grad = k.grad = v.grad = None
        call().backward(dout)

    timed = {}
    try:
        plan = []
        if "fwd" in directions or "bwd" in directions:
            plan.append(("fwd", forward))
        if needs_grad:
            plan.append(("fwdbwd", forward_backward))
        for name, fn in plan:
            estimate_s = timing.single_call_ms(fn, device) * (runs * queue + warmup) / 1e3
            if estimate_s > limits.max_case_s:
                return f"{name} would take ~{estimate_s:.0f} s (--max-case-s {limits.max_case_s:g})"
            timed[name] = timing.median_ms(fn, device, runs, warmup, queue)
    except torch.cuda.OutOfMemoryError:
        return "out of memory"
    except (RuntimeError, ValueError, NotImplementedError) as error:  # a backend refusing a shape
        return str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
    if "bwd" in directions:
        if timed["fwdbwd"] <= timed["fwd"]:  # timing noise larger than the backward (CPU, tiny cases)
            return f"fwd+bwd ({timed['fwdbwd']:.3g} ms) not above fwd ({timed['fwd']:.3g} ms)"
        timed["bwd"] = timed["fwdbwd"] - timed["fwd"]
    return {d: timed[d] for d in directions}
