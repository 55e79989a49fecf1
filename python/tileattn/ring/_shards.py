"""Cutting a sequence into ring shards and putting it back together.

Zigzag: a sequence of length N is cut into 2W chunks of N / (2W) tokens; rank r holds chunks r and
2W-1-r.  Under a causal mask chunk c costs work proportional to c + 1/2, so each rank's pair costs
the same (r + 2W-1-r + 1 = 2W): no rank idles at a ring step (see _layout.py for the three cases).
"""

import torch

from .._ffi import InvalidArgumentError


def _chunks(x, world_size, dim, name, length=None):
    length = x.shape[dim] if length is None else length
    if length % (2 * world_size) != 0:
        raise InvalidArgumentError(
            f"{name}: a length of {length} cannot be cut into 2 x {world_size} equal chunks "
            f"(zigzag sharding over {world_size} ranks needs a multiple of {2 * world_size})",
            name)
    return x.chunk(2 * world_size, dim)


def zigzag_shard(x, rank, world_size, dim=1):
    """Rank `rank`'s shard of x (its sequence along `dim`): chunks rank and 2W-1-rank."""
    chunks = _chunks(x, world_size, dim, "x")
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim)


def zigzag_unshard(shards, dim=1):
    """The inverse of zigzag_shard: the whole sequence from every rank's shard, in rank order."""
    world_size = len(shards)
    halves = [shard.chunk(2, dim) for shard in shards]
    ordered = [halves[c][0] for c in range(world_size)]
    ordered += [halves[2 * world_size - 1 - c][1] for c in range(world_size, 2 * world_size)]
    return torch.cat(ordered, dim)


def zigzag_shard_varlen(x, cu_seqlens, rank, world_size):
    """Rank `rank`'s shard of a packed batch x (total, ...) with int32 cu_seqlens: every sequence
    sharded as zigzag_shard does, packed back to back.  Returns (x_local, cu_seqlens_local);
    cu_seqlens_local is the same on every rank."""
    bounds = cu_seqlens.tolist()
    pieces, local = [], [0]
    for start, end in zip(bounds, bounds[1:]):
        pieces.append(zigzag_shard_one(x[start:end], rank, world_size))
        local.append(local[-1] + (end - start) // world_size)
    return torch.cat(pieces, 0), torch.tensor(local, dtype=torch.int32, device=cu_seqlens.device)


def zigzag_shard_one(x, rank, world_size):
    chunks = _chunks(x, world_size, 0, "cu_seqlens")
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], 0)


def zigzag_unshard_varlen(shards, cu_seqlens_local):
    """The packed batch from every rank's zigzag_shard_varlen output, in rank order."""
    bounds = cu_seqlens_local.tolist()
    sequences = [zigzag_unshard([shard[a:b] for shard in shards], dim=0)
                 for a, b in zip(bounds, bounds[1:])]
    return torch.cat(sequences, 0)
