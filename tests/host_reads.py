"""`HostReads`: counts the ops that read a tensor's value on the host (`.item()`, `.tolist()`, `bool(t)`, `x in t`).
On a GPU each is a device→host sync that stops the CPU from queueing work ahead of the GPU, and none may run while
a CUDA graph is being captured; the count is the same on a CPU, so CPU tests can hold a path to "no host reads"."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)


class HostReads(TorchDispatchMode):
    """`with HostReads() as reads: ...`, then `reads.count`."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in HOST_READS
        return func(*args, **(kwargs or {}))
