"""The owner coordinates of the running code: (rank, world_size, worker, num_workers).

Ownership comes from torch itself — the process group for the rank and
``torch.utils.data.get_worker_info()`` for the DataLoader worker — or from explicit arguments,
never from environment guesses.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.utils.data import get_worker_info

from pipeline.readers import split


class SplitMismatch(ValueError):
    """Ranks of one process group built readers with different split parameters."""


class NoProcessGroupWarning(UserWarning):
    """Rank and world size fell back to (0, 1) although the environment names a larger world."""


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
    env_world = os.environ.get("WORLD_SIZE", "")
    if env_world.isdigit() and int(env_world) > 1:
        warnings.warn(
            f"no process group is initialised, so this reader runs as rank 0 of 1, but "
            f"WORLD_SIZE={env_world} (RANK={os.environ.get('RANK', '?')}) is set: every rank "
            "would read every item. Call torch.distributed.init_process_group() before building "
            "the sampler, dataset or loader, or pass rank= and world_size=",
            NoProcessGroupWarning,
            stacklevel=3,
        )
    return 0, 1


def agree_across_ranks(what: str, params: Mapping[str, Any], rank: int, world_size: int) -> None:
    """Refuse, on every rank, a reader whose split parameters differ between the ranks.

    Runs one ``all_gather_object`` of ``params`` when a process group is initialised and
    (``rank``, ``world_size``) are its own, so every rank must build the same readers in the same
    order (as with any collective). Raises :class:`SplitMismatch` naming each differing value by
    rank. Without a process group (or for a reader pinned to other coordinates) it does nothing.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if (rank, world_size) != (dist.get_rank(), dist.get_world_size()) or world_size == 1:
        return
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, dict(params))
    differ = [
        f"{key}: " + ", ".join(f"rank {r} = {g.get(key)!r}" for r, g in enumerate(gathered))
        for key in params
        if any(g.get(key) != gathered[0].get(key) for g in gathered)
    ]
    if differ:
        raise SplitMismatch(
            f"ranks disagree on the split of {what}; every rank must build it with the same "
            "parameters or items are read twice or not at all: " + "; ".join(differ)
        )
