"""The owner coordinates of the running code: (rank, world_size, worker, num_workers).

Ownership comes from torch itself — the process group for the rank and
``torch.utils.data.get_worker_info()`` for the DataLoader worker — or from explicit arguments,
never from environment guesses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.utils.data import get_worker_info

from pipeline.readers import split


@dataclass(frozen=True)
class Owner:
    """One reader of a split: a DataLoader worker (or the main process) of one rank."""

    rank: int
    world_size: int
    worker: int
    num_workers: int

    def __post_init__(self) -> None:
        split.owner_index(self.rank, self.world_size, self.worker, self.num_workers)  # validates

    @property
    def index(self) -> int:
        """This owner's position among all owners, rank-major: ``rank * workers + worker``."""
        return split.owner_index(self.rank, self.world_size, self.worker, self.num_workers)[0]

    @property
    def count(self) -> int:
        """How many owners there are in total (``num_workers=0`` counts as one per rank)."""
        return split.owner_index(self.rank, self.world_size, self.worker, self.num_workers)[1]

    @classmethod
    def current(cls, rank: int | None = None, world_size: int | None = None) -> Owner:
        """The owner this code runs as: given rank/world, else the process group's, else (0, 1).

        The worker comes from ``get_worker_info()`` (``(0, 0)`` in the main process). Call the
        rank part in the main process: a spawned DataLoader worker has no process group.
        """
        rank, world_size = process_rank(rank, world_size)
        info = get_worker_info()
        if info is None:
            return cls(rank, world_size, 0, 0)
        return cls(rank, world_size, info.id, info.num_workers)


def process_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Resolve (rank, world_size): explicit values win, then an initialised process group."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"give both rank and world_size or neither, got rank={rank}, world_size={world_size}"
        )
    if rank is not None and world_size is not None:
        split.owner_index(rank, world_size, 0, 0)  # validates
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
