"""Passing tensors one step around the ring with torch.distributed point-to-point operations:
every rank sends to rank + 1 and receives from rank - 1 (ranks of `group`), asynchronously, so
the transfer overlaps the attention computed meanwhile (NCCL on GPUs, gloo on CPUs)."""

import torch
import torch.distributed as dist


class Ring:
    def __init__(self, group):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self._next = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
        self._prev = dist.get_global_rank(self.group, (self.rank - 1) % self.size)

    def start(self, tensors, tag):
        """Send `tensors` to the next rank and receive same-shaped ones from the previous; returns
        a Transfer whose wait() gives the received tensors.  `tag` keeps the K/V stream apart
        from the gradient stream (gloo matches on it; NCCL matches by order, which is the same
        on every rank)."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self._next, self.group, tag) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self._prev, self.group, tag) for r in received]
        return Transfer(dist.batch_isend_irecv(ops), received)


class Transfer:
    def __init__(self, requests, received):
        self._requests = requests
        self._received = received

    def wait(self):
        for request in self._requests:
            request.wait()
        return self._received
