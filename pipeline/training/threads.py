"""How many intra-op threads torch gets in a training process.

torch starts with one intra-op thread per core of the machine, whatever else runs: the ranks of
the same machine and their DataLoader workers then contend for the same cores, and on a busy
machine an epoch slows several times over (docs/performance.md). A training process takes its
share instead: the cores it may use (its CPU affinity, which a container or ``taskset`` narrows)
divided among the ranks on the machine, less one per DataLoader worker, and at least one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def intra_op_threads(ranks_here: int, num_workers: int, cores: int | None = None) -> int:
    """One rank's share of ``cores`` (default :func:`usable_cores`) when ``ranks_here`` ranks
    run on the machine, each with ``num_workers`` DataLoader workers."""
    if ranks_here < 1 or num_workers < 0:
        raise ValueError(
            f"ranks_here must be >= 1 and num_workers >= 0, got {ranks_here}, {num_workers}"
        )
    cores = usable_cores() if cores is None else cores
    return max(1, cores // ranks_here - num_workers)


@contextmanager
def torch_threads(n: int) -> Iterator[int]:
    """torch's intra-op threads at ``n`` inside the block, as they were after it (the step may
    share its process with other work, as an in-process Dagster step does)."""
    if n < 1:
        raise ValueError(f"thread count must be >= 1, got {n}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
