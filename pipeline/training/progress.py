"""Mid-fit checkpoints: a fit killed mid-epoch resumes from the last cut every rank committed.

torchrun's answer to a dead rank is to restart every rank (``--max-restarts``) and leave the
resuming to the script; Dagster's answer to a dead step is a retried run. Either way the new
processes find here the last *cut*: rank 0's shared state (model, optimizer, loss so far) and each
rank's own (where its loader stood, from ``state_dict()``), all taken after the same step. A cut
is committed by one small file that rank 0 writes only after every rank has written its part, so
a rank killed while saving leaves the previous cut in force, never a mix of two.

Everything is saved as tensors and plain data and loaded with ``weights_only=True``: a progress
file can never run code. The directory is the pipeline's to choose (keyed by data, trainer,
config — not the shape — so a changed run never resumes a stale one, while the same run restarted
on another number of ranks resumes from every old rank's part) and removed once the fit has
finished and its checkpoint is written.
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.bundle.atomic import atomic_write_bytes, atomic_write_text

COMMITTED = "committed.json"
_CUT = "step-{:010d}"


class ProgressError(ValueError):
    """A committed cut cannot be resumed here (a rank's file is missing or unreadable)."""


@dataclass(frozen=True)
class Resumed:
    """The cut a fit resumes from: the step it was taken after, and what was saved.

    ``locals`` holds every rank's own part, by rank, as the cut's ``world_size`` ranks saved
    them; ``local`` is this rank's when the fit resumes at that world size, else None (merge
    the loader states of ``locals`` to resume at another shape).
    """

    step: int
    shared: dict[str, Any]
    locals: list[dict[str, Any]]
    world_size: int
    local: dict[str, Any] | None


class Progress:
    """Save and find mid-fit cuts in ``directory``; without one, saving does nothing.

    ``every`` is how many optimizer steps apart a trainer should save (:meth:`due`); 0 never.
    :meth:`save` and :meth:`clear` are collectives when ``world_size > 1``: every rank calls them
    after the same step.
    """

    def __init__(
        self, directory: Path | None, *, rank: int = 0, world_size: int = 1, every: int = 0
    ) -> None:
        if every < 0:
            raise ValueError(f"checkpoint every {every} steps: must be >= 0")
        self.directory = Path(directory) if directory is not None else None
        self.rank = rank
        self.world_size = world_size
        self.every = every
        self.resumed_from: int | None = None  # the step of the cut :meth:`load` found
        self.resumed_world_size: int | None = None  # the world size that cut was taken at

    @property
    def enabled(self) -> bool:
        """Whether this fit saves cuts at all."""
        return self.directory is not None and self.every > 0

    def due(self, step: int) -> bool:
        """Whether a cut is due after optimizer step ``step`` (counted from 1, across epochs)."""
        return self.enabled and step > 0 and step % self.every == 0

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def save(self, step: int, *, shared: dict[str, Any], local: dict[str, Any]) -> None:
        """Commit the cut after ``step``: ``shared`` from rank 0, ``local`` from every rank.

        Each rank writes its own file atomically; rank 0 then commits the cut by naming it in
        ``committed.json`` and removes the older cuts. A collective.
        """
        if self.directory is None:
            return
        cut = self.directory / _CUT.format(step)
        cut.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {"step": step, "local": local}
        if self.rank == 0:
            data["shared"] = shared
        buf = io.BytesIO()
        torch.save(data, buf)
        atomic_write_bytes(cut / f"rank-{self.rank}.pt", buf.getvalue())
        self._barrier()  # every rank's part is on disk before the cut is committed
        if self.rank == 0:
            text = json.dumps({"step": step, "world_size": self.world_size})
            atomic_write_text(self.directory / COMMITTED, text)
            for old in self.directory.glob("step-*"):
                if old.name < cut.name:  # never a newer cut another rank may be writing
                    shutil.rmtree(old, ignore_errors=True)
        self._barrier()

    def load(self) -> Resumed | None:
        """The last committed cut (every rank's part and rank 0's shared state), else ``None``.

        The cut may have been taken at another world size: the fit then resumes the trainer's
        state from rank 0's part and re-splits what its loaders had not delivered.
        """
        if self.directory is None or not (self.directory / COMMITTED).is_file():
            return None
        committed = json.loads((self.directory / COMMITTED).read_text())
        step, world = int(committed["step"]), int(committed["world_size"])
        cut = self.directory / _CUT.format(step)

        def part(rank: int) -> dict[str, Any]:
            path = cut / f"rank-{rank}.pt"
            if not path.is_file():
                raise ProgressError(f"{cut}: committed, but rank {rank}'s part is missing")
            # on the CPU whatever device saved it: a fit may resume on other hardware
            return torch.load(path, weights_only=True, map_location="cpu")

        parts = [part(r) for r in range(world)]
        self.resumed_from = step
        self.resumed_world_size = world
        return Resumed(
            step=step,
            shared=parts[0]["shared"],
            locals=[p["local"] for p in parts],
            world_size=world,
            local=parts[self.rank]["local"] if world == self.world_size else None,
        )

    def clear(self) -> None:
        """Remove every cut: the fit finished and its checkpoint supersedes them. A collective."""
        self._barrier()
        if self.rank == 0 and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
