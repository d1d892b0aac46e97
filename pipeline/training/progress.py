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

One fit at a time owns a directory's cuts: :meth:`Progress.claimed` takes an exclusive lock
beside it for the fit's whole life, so no second process (a retried run while the first still
runs, a rank left over from a killed launch) writes or prunes them meanwhile. The kernel drops
the lock of a process that dies, however it dies, so a dead fit's claim is taken over at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.bundle.atomic import atomic_write_bytes, atomic_write_text
from pipeline.training.cut_mirror import COMMITTED, CUT, CutMirror

#: Seconds a fit waits for another live fit's claim on the same cuts before it refuses: long
#: enough for a process that is being killed to be gone, short enough to fail a run visibly.
CLAIM_WAIT = 60.0


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
        self,
        directory: Path | None,
        *,
        rank: int = 0,
        world_size: int = 1,
        every: int = 0,
        mirror: CutMirror | None = None,
    ) -> None:
        if every < 0:
            raise ValueError(f"checkpoint every {every} steps: must be >= 0")
        self.directory = Path(directory) if directory is not None else None
        self.rank = rank
        self.world_size = world_size
        self.every = every
        # ranks on machines with no shared disk: every part and commit also goes there
        self.mirror = mirror if directory is not None else None
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

    @contextlib.contextmanager
    def claimed(self, wait: float = CLAIM_WAIT) -> Iterator[None]:
        """Hold this fit's exclusive claim on its cuts while the block runs. A collective.

        Rank 0 takes the claim for every rank of its fit; while another live process holds it,
        rank 0 waits up to ``wait`` seconds, then every rank raises :class:`ProgressError`
        naming the holder. The claim is a lock on a file beside the directory (never inside it:
        :meth:`clear` removes the directory while the claim is held), released when the block
        ends or the process dies.
        """
        if self.directory is None:
            yield
            return
        fd = self._claim(wait) if self.rank == 0 else None
        held = fd is not None and fd >= 0
        if self.world_size > 1:
            flag = torch.tensor([1 if held or self.rank != 0 else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            held_by_all = bool(flag.item())
        else:
            held_by_all = held
        if not held_by_all:
            holder = self._holder() if self.rank == 0 else "another process"
            raise ProgressError(
                f"{self.directory}: another fit holds these cuts ({holder}) and did not let go "
                f"within {wait:.0f} s; it must end before this one can resume them"
            )
        try:
            yield
        finally:
            if fd is not None and fd >= 0:
                os.close(fd)  # releases the lock

    @property
    def _claim_path(self) -> Path:
        assert self.directory is not None
        return self.directory.with_name(f".{self.directory.name}.claim")

    def _claim(self, wait: float) -> int:
        """Lock the claim file (waiting up to ``wait`` seconds); its descriptor, or -1."""
        self._claim_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._claim_path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return -1
                time.sleep(0.2)
        # who holds it, for the message another fit would give
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        return fd

    def _holder(self) -> str:
        try:
            return self._claim_path.read_text().strip() or "a process"
        except OSError:
            return "a process"

    def save(self, step: int, *, shared: dict[str, Any], local: dict[str, Any]) -> None:
        """Commit the cut after ``step``: ``shared`` from rank 0, ``local`` from every rank.

        Each rank writes its own file atomically; rank 0 then commits the cut by naming it in
        ``committed.json`` and removes the older cuts. A collective.
        """
        if self.directory is None:
            return
        cut = self.directory / CUT.format(step)
        cut.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {"step": step, "local": local}
        if self.rank == 0:
            data["shared"] = shared
        buf = io.BytesIO()
        torch.save(data, buf)
        part = cut / f"rank-{self.rank}.pt"
        atomic_write_bytes(part, buf.getvalue())
        if self.mirror is not None:
            self.mirror.push(part, f"{cut.name}/{part.name}")
        self._barrier()  # every rank's part is on disk (and mirrored) before the cut is committed
        if self.rank == 0:
            text = json.dumps({"step": step, "world_size": self.world_size})
            atomic_write_text(self.directory / COMMITTED, text)
            if self.mirror is not None:
                self.mirror.push(self.directory / COMMITTED, COMMITTED)
                self.mirror.prune(cut.name)
            for old in self.directory.glob("step-*"):
                if old.name < cut.name:  # never a newer cut another rank may be writing
                    shutil.rmtree(old, ignore_errors=True)
        self._barrier()

    def load(self) -> Resumed | None:
        """The last committed cut (every rank's part and rank 0's shared state), else ``None``.

        The cut may have been taken at another world size: the fit then resumes the trainer's
        state from rank 0's part and re-splits what its loaders had not delivered.
        """
        if self.directory is None:
            return None
        if self.mirror is not None:  # the mirror's last commit is the one in force
            self.mirror.pull(self.directory)
        if not (self.directory / COMMITTED).is_file():
            return None
        committed = json.loads((self.directory / COMMITTED).read_text())
        step, world = int(committed["step"]), int(committed["world_size"])
        cut = self.directory / CUT.format(step)

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
            if self.mirror is not None:
                self.mirror.clear()
