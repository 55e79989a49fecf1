"""Ring attention over torch.distributed with gloo: W processes on this machine, each holding a
shard of the sequence.  The unsharded result must match float64 attention over the whole sequence
by FA's rule (forward and backward, causal with zigzag shards and not, GQA, the packed form)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attn_reference as ref
from conftest import FLOOR, assert_fa_close
import tileattn
from tileattn import ring

# (world size, case list): each case is a dict of the inputs' shape and options; one spawn per
# world size runs them all, to pay the processes' start once.
BATCH_CASES = [
    dict(batch=2, seqlen_q=84, seqlen_k=84, heads=7, heads_k=1, dim=64, causal=True,
         dtype=torch.bfloat16),
    dict(batch=1, seqlen_q=51, seqlen_k=120, heads=4, heads_k=2, dim=40, causal=False,
         dtype=torch.float32),
    dict(batch=1, seqlen_q=144, seqlen_k=144, heads=2, heads_k=2, dim=96, causal=True,
         dtype=torch.float16, softcap=5.0, softmax_scale=0.3),
]
VARLEN_LENGTHS = [48, 96, 0, 144]  # multiples of 2W for W = 2, 3, 4 and 8


def _shard(x, rank, world, causal, dim=1):
    if causal:
        return ring.zigzag_shard(x, rank, world, dim)
    return x.chunk(world, dim)[rank]


def _unshard(shards, causal, dim=1):
    return ring.zigzag_unshard(shards, dim) if causal else torch.cat(shards, dim)


def _worker(rank, world, backend, folder):
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{rank}"
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank,
                            world_size=world)
    inputs = torch.load(f"{folder}/inputs.pt")
    inputs["tensors"] = [[x.to(device) for x in case] for case in inputs["tensors"]]
    inputs["packed"] = [x.to(device) for x in inputs["packed"]]
    inputs["cu_seqlens"] = inputs["cu_seqlens"].to(device)
    results = []
    for case, (q, k, v, dout) in zip(inputs["cases"], inputs["tensors"]):
        causal = case["causal"]
        local = [_shard(x, rank, world, causal).detach().requires_grad_(x is not dout)
                 for x in (q, k, v, dout)]
        out, lse = tileattn.ring_flash_attn_func(
            *local[:3], causal=causal, softcap=case.get("softcap", 0.0),
            softmax_scale=case.get("softmax_scale"), return_softmax_lse=True)
        out.backward(local[3])
        results.append([x.cpu() for x in (out.detach(), lse, *(t.grad for t in local[:3]))])
    q, k, v, dout = inputs["packed"]
    cu_seqlens = inputs["cu_seqlens"]
    local = [ring.zigzag_shard_varlen(x, cu_seqlens, rank, world)[0] for x in (q, k, v, dout)]
    cu_local = ring.zigzag_shard_varlen(q, cu_seqlens, rank, world)[1]
    local[:3] = [x.requires_grad_() for x in local[:3]]
    out = tileattn.ring_flash_attn_varlen_func(*local[:3], cu_local, int(cu_local.diff().max()),
                                               causal=True, deterministic=True)
    out.backward(local[3])
    packed = [x.cpu() for x in (out.detach(), *(t.grad for t in local[:3]), cu_local)]
    errors = []
    for bad in (lambda: tileattn.ring_flash_attn_func(*[torch.zeros(1, 3, 2, 8)] * 3,
                                                      causal=True),
                lambda: tileattn.ring_flash_attn_func(*[torch.zeros(1, 4, 2, 8)] * 3,
                                                      window_size=(3, 0))):
        try:
            bad()
            errors.append(None)
        except tileattn.InvalidArgumentError as e:
            errors.append(str(e))
    torch.save({"batch": results, "packed": packed, "errors": errors}, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


def _run(world, backend, tmp_path, cases, monkeypatch):
    tensors = []
    for case in cases:
        q = torch.randn(case["batch"], case["seqlen_q"], case["heads"], case["dim"]).to(case["dtype"])
        k = torch.randn(case["batch"], case["seqlen_k"], case["heads_k"], case["dim"]).to(case["dtype"])
        tensors.append((q, k, torch.randn_like(k), torch.randn_like(q)))
    lengths = VARLEN_LENGTHS
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    packed = [torch.randn(sum(lengths), heads, 32, dtype=torch.bfloat16) for heads in (6, 2, 2, 6)]
    torch.save({"cases": cases, "tensors": tensors, "packed": packed, "cu_seqlens": cu_seqlens},
               tmp_path / "inputs.pt")
    # One OpenMP thread per process: W processes share this machine's cores.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(world, backend, str(tmp_path)), nprocs=world, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    return tensors, packed, cu_seqlens, ranks


def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() and tileattn.has_cuda() else 0


# gloo on CPU processes always (CI); NCCL with one GPU per rank where the machine has them.
SETUPS = [("gloo", 2), ("gloo", 3)] + [
    pytest.param("nccl", n, marks=pytest.mark.skipif(_gpus() < n, reason=f"needs {n} GPUs"))
    for n in (2, 4, 8)]


@pytest.mark.parametrize("backend, world", SETUPS)
def test_ring_matches_whole_sequence_attention(backend, world, tmp_path, monkeypatch):
    cases = [c for c in BATCH_CASES if (not c["causal"] or c["seqlen_q"] % (2 * world) == 0)
             and (backend == "gloo" or c["dtype"] != torch.float32)]
    tensors, packed, cu_seqlens, ranks = _run(world, backend, tmp_path, cases, monkeypatch)
    for index, (case, (q, k, v, dout)) in enumerate(zip(cases, tensors)):
        causal = case["causal"]
        names = ["out", "lse", "dq", "dk", "dv"]
        ours = {}
        for i, name in enumerate(names):
            dim = 2 if name == "lse" else 1
            ours[name] = _unshard([r["batch"][index][i] for r in ranks], causal, dim)
        options = dict(window_right=0 if causal else -1, softcap=case.get("softcap", 0.0),
                       softmax_scale=case.get("softmax_scale"))
        truth = ref.attention(q, k, v, dout, dtype=torch.float64, **options)
        naive = ref.attention(q, k, v, dout, dtype=case["dtype"], **options)
        floor = FLOOR[case["dtype"]]
        tag = f"W={world} {case}"
        for name in names:
            assert_fa_close(f"{tag} {name}", ours[name], naive[name], truth[name], floor,
                            lse=truth["lse"] if name.startswith("d") else None)

    q, k, v, dout = packed
    cu_local = ranks[0]["packed"][4]
    ours = [ring.zigzag_unshard_varlen([r["packed"][i] for r in ranks], cu_local) for i in range(4)]
    bounds = cu_seqlens.tolist()
    for b, (start, end) in enumerate(zip(bounds, bounds[1:])):
        if start == end:
            continue
        args = [x[start:end].unsqueeze(0) for x in (q, k, v, dout)]
        truth = ref.attention(*args, dtype=torch.float64, window_right=0)
        naive = ref.attention(*args, dtype=torch.bfloat16, window_right=0)
        for i, name in enumerate(["out", "dq", "dk", "dv"]):
            assert_fa_close(f"W={world} packed sequence {b} {name}",
                            ours[i][start:end].unsqueeze(0), naive[name], truth[name],
                            FLOOR[torch.bfloat16], lse=truth["lse"] if i else None)

    odd_length, window = ranks[0]["errors"]
    assert odd_length is not None and "zigzag" in odd_length
    assert window is not None and "window_size" in window


def test_ring_needs_an_initialized_group():
    x = torch.zeros(1, 4, 2, 8)
    with pytest.raises(tileattn.InvalidArgumentError, match="group"):
        tileattn.ring_flash_attn_func(x, x, x)
