"""DDP's gradient average through shared memory, for ranks that share one host's CPU.

Gloo all-reduces a CPU bucket over TCP, through its own threads: for ranks on one machine every
step then pays several loopback round trips and the thread wake-ups behind them, which on a
busy host cost as much as the model's own step (docs/performance.md). Ranks on one host can
instead leave their bucket in a segment of shared memory they all map and each add up the
others' copies. This module is that, as a DDP communication hook (DDP's own extension point,
``register_comm_hook``): DDP still buckets, broadcasts, joins and checks as always; only the
averaging moves.

Every rank adds the buckets in rank order, so every rank computes the same sum, bit for bit, and
the replicas stay equal. A bucket is divided by the world size before it is shared, as DDP's
default hook does. Each step alternates between two sets of slots, so a rank that has finished
adding may write its next bucket while a slower rank still reads this one: it cannot be more
than one step ahead, since its next wait needs that rank's next bucket.

The segment is used only where it is known to work: ranks on the CPU, every rank able to map the
one segment rank 0 made (a rank on another machine cannot open it, and then no rank uses it),
``/dev/shm`` with room for it (reserved up front: a write to a full tmpfs is a SIGBUS, not an
error), and an x86-64 CPU, whose stores reach other cores in the order they were made, so a
rank's step counter is never seen before the bucket it announces. Elsewhere gloo averages, as
before. The file is unlinked as soon as every rank has mapped it: nothing is left behind by a
crash.

Gloo learns of a dead peer from its socket closing; a segment says nothing when a rank dies. So
each rank holds a lock on a byte of the segment's file of its own, which the kernel releases when
the process ends however it ends, and a rank waiting long on another tests that rank's lock: a
rank gone (a lost node's, a SIGKILLed one's) is an error at once, which torchrun answers as it
answers gloo's, by restarting the ranks.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import datetime
import fcntl
import mmap
import os
import platform
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

#: Where POSIX shared memory lives on Linux (a tmpfs).
SHM_DIR = Path("/dev/shm")
_PREFIX = "lithi-ddp-"
_TOKEN_BYTES = 16
_LINE = 64  # each rank's counter on a cache line of its own: no two ranks write one line
#: Machines (``platform.machine()``, lower case) whose stores other cores see in program order
#: (x86-64's total store order): the only ones the segment is used on.
IN_ORDER_STORES = frozenset({"x86_64", "amd64"})


class HostAllReduceError(RuntimeError):
    """A rank waited for another that has ended, or longer than the process group's timeout."""


@dataclass
class HostAllReduce:
    """A mapped segment: every rank's step counter, then two sets of ``world`` slots."""

    rank: int
    world: int
    capacity: int  # bytes one slot holds
    fd: int  # the segment's file, open while this rank lives: its lock says it is alive
    mapping: mmap.mmap
    timeout_s: float
    step: int = 0
    steps: np.ndarray = field(init=False, repr=False)
    slots: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        header = _header_bytes(self.world)
        lines = np.frombuffer(self.mapping, dtype=np.int64, count=header // 8)
        self.steps = lines.reshape(1 + self.world, _LINE // 8)[1:, 0]  # line 0 holds the token
        data = torch.frombuffer(self.mapping, dtype=torch.uint8, offset=header)
        self.slots = data.view(2, self.world, self.capacity)

    def average(self, bucket: torch.Tensor) -> torch.Tensor:
        """``bucket`` replaced by the mean of every rank's, in place, and returned."""
        nbytes = bucket.numel() * bucket.element_size()
        if nbytes > self.capacity:
            raise ValueError(
                f"a gradient bucket of {nbytes} bytes does not fit the {self.capacity}-byte "
                "slots made for this model"
            )
        self.step += 1
        mine = self.slots[self.step % 2]
        views = [slot[:nbytes].view(bucket.dtype) for slot in mine]
        bucket.div_(self.world)
        views[self.rank].copy_(bucket)
        self.steps[self.rank] = self.step  # after the copy: others read the bucket once they see it
        self._wait_for_all()
        bucket.copy_(views[0])
        for other in views[1:]:
            bucket.add_(other)
        return bucket

    def _wait_for_all(self) -> None:
        started = time.monotonic()
        spins = 0
        for other in range(self.world):
            while self.steps[other] < self.step:
                spins += 1
                if spins < 10_000:
                    os.sched_yield()  # whatever else this core has runs first
                    continue
                # a long wait (a rank reading, or gone): sleep in short beats, asking now and
                # then whether the rank still lives, and give up at the process group's timeout
                time.sleep(0.0002)
                if spins % 50 == 0:
                    self._check_alive(other, time.monotonic() - started)

    def _check_alive(self, other: int, waited: float) -> None:
        if not _rank_lock_held(self.fd, other):
            raise HostAllReduceError(
                f"rank {other} ended while rank {self.rank} waited {waited:.1f} s for its "
                f"gradient step {self.step}"
            )
        if waited > self.timeout_s:
            raise HostAllReduceError(
                f"rank {self.rank} waited {waited:.0f} s for rank {other} to reach gradient "
                f"step {self.step}"
            )

    def close(self) -> None:
        """Unmap the segment (torch's view of it goes first) and close its file."""
        del self.slots, self.steps
        self.mapping.close()
        os.close(self.fd)


def host_allreduce_hook(
    state: HostAllReduce, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """The communication hook: ``bucket``'s mean over the ranks, already done."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(state.average(bucket.buffer()))
    return fut


def attach_host_allreduce(
    ddp: nn.parallel.DistributedDataParallel,
    model: nn.Module,
    *,
    shm_dir: Path = SHM_DIR,
    timeout: datetime.timedelta = dist.constants.default_pg_timeout,
) -> tuple[HostAllReduce | None, str]:
    """Register the shared-memory hook on ``ddp`` where every rank can use it.

    Collective: every rank calls it, and every rank gets the same answer. Returns the state (to
    :meth:`HostAllReduce.close` after the fit) or None, and a line saying which and why. A rank
    waits on the others at most ``timeout`` (the process group's default, as gloo would).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    capacity = _slot_bytes(ddp, model)
    size = _header_bytes(world) + 2 * world * capacity
    mine = _unusable_here(model, shm_dir)
    name, token, made = "", "", mine
    if rank == 0 and not mine:
        name, token, made = _make_segment(shm_dir, size)
    offer = [name, token, made]
    dist.broadcast_object_list(offer, src=0)
    name, token, made = offer
    reason = mine or made
    opened: tuple[int, mmap.mmap] | None = None
    if not reason:
        opened, reason = _open_segment(shm_dir / name, size, token, rank)
    # every rank says whether it mapped the segment; one that could not turns it off for all
    reasons: list[str] = [""] * world
    dist.all_gather_object(reasons, reason)
    if rank == 0 and name:
        (shm_dir / name).unlink(missing_ok=True)  # every rank has mapped it or given up
    refused = [(r, why) for r, why in enumerate(reasons) if why]
    if refused:
        if opened is not None:
            opened[1].close()
            os.close(opened[0])
        r, why = refused[0]
        return None, f"gradients averaged by {dist.get_backend()}: rank {r}: {why}"
    assert opened is not None  # else this rank's own reason would be among those refused
    fd, mapping = opened
    state = HostAllReduce(rank, world, capacity, fd, mapping, timeout.total_seconds())
    ddp.register_comm_hook(state, host_allreduce_hook)
    return state, f"gradients averaged in shared memory ({world} ranks on one host)"


def _unusable_here(model: nn.Module, shm_dir: Path) -> str:
    """Why this rank cannot use the segment, or ''."""
    if platform.machine().lower() not in IN_ORDER_STORES:
        return f"{platform.machine()} may reorder stores between cores"
    if any(p.device.type != "cpu" for p in model.parameters()):
        return "the model is not on the CPU"
    if not shm_dir.is_dir():
        return f"no {shm_dir}"
    return ""


def _make_segment(shm_dir: Path, size: int) -> tuple[str, str, str]:
    """Rank 0's segment: its name, the token other ranks check, or why there is none."""
    token = secrets.token_hex(_TOKEN_BYTES // 2)
    name = f"{_PREFIX}{token}"
    path = shm_dir / name
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        return "", "", f"cannot create a segment in {shm_dir}: {e.strerror}"
    try:
        os.posix_fallocate(fd, 0, size)
        os.pwrite(fd, token.encode(), 0)
    except OSError as e:
        os.close(fd)
        path.unlink(missing_ok=True)
        return "", "", f"{shm_dir} has no room for {size} bytes: {e.strerror}"
    os.close(fd)
    return name, token, ""


def _open_segment(
    path: Path, size: int, token: str, rank: int
) -> tuple[tuple[int, mmap.mmap] | None, str]:
    """``path`` open, locked for ``rank`` and mapped, if it is rank 0's segment (its token);
    else None and why."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        return None, f"cannot open rank 0's segment (another host?): {e.strerror}"
    try:
        if os.fstat(fd).st_size != size:
            raise ValueError("found a segment of another size under rank 0's name")
        mapping = mmap.mmap(fd, size)
        if mapping[: len(token)] != token.encode():
            mapping.close()
            raise ValueError("found another segment under rank 0's name")
        # held until this process ends: the others' test that it lives
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _lock_byte(rank))
    except (OSError, ValueError) as e:
        os.close(fd)
        return None, str(e)
    return (fd, mapping), ""


def _rank_lock_held(fd: int, rank: int) -> bool:
    """Whether a live process holds ``rank``'s lock on the segment's file."""
    start = _lock_byte(rank)
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, start)
    except OSError:
        return True  # held: the rank lives
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, start)
    return False


def _lock_byte(rank: int) -> int:
    """``rank``'s lock: a byte far past the segment's end (a lock may lie beyond it), apart from
    anything a rank reads or writes."""
    return (1 << 40) + rank


def _slot_bytes(ddp: nn.parallel.DistributedDataParallel, model: nn.Module) -> int:
    """The most bytes a bucket can hold: DDP closes a bucket once it reaches its cap, so one
    holds at most the cap plus one tensor, and never more than every gradient."""
    sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    most = min(sum(sizes), int(ddp.bucket_bytes_cap) + max(sizes, default=0))
    return -(-most // _LINE) * _LINE


def _header_bytes(world: int) -> int:
    """A line for the token, then a line per rank's step counter."""
    return (1 + world) * _LINE
