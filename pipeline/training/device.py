"""Where a rank trains: its device, the process group's backend for it, and batches moved there.

One rule for every launch path (in the Dagster step, on each ``torchrun`` rank, in a script):
the device is ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU, unless a setting names
one (``LITHI_DEVICE``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``). Nothing here imports Dagster.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import torch

#: What ``LITHI_DEVICE`` (and ``--device``) accept.
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


class DeviceError(ValueError):
    """A device setting that is malformed or names hardware this process cannot use."""


def check_device_setting(setting: str) -> str:
    """``setting`` if it is one of ``auto``, ``cpu``, ``cuda``, ``cuda:N``; else DeviceError."""
    if not DEVICE_PATTERN.fullmatch(setting):
        raise DeviceError(f"device {setting!r}: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return setting


def choose_device(
    setting: str = "auto",
    *,
    local_rank: int | None = None,
    cuda_available: bool | None = None,
    cuda_count: int | None = None,
) -> torch.device:
    """The device this rank trains on.

    ``auto`` is ``cuda:<local_rank>`` when CUDA is available (one GPU per local rank, the
    ``torchrun`` convention; ``local_rank`` defaults to ``$LOCAL_RANK``, 0 when unset), else
    ``cpu``. ``cuda`` is the same GPU but refuses to fall back;
    ``cuda:N`` names one; ``cpu`` forces the CPU. ``cuda_available`` and ``cuda_count`` default
    to what torch sees (tests pass them to decide without a GPU).
    """
    check_device_setting(setting)
    if setting == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if setting == "auto" and not available:
        return torch.device("cpu")
    if not available:
        raise DeviceError(f"device {setting!r}: CUDA is not available to this process")
    count = torch.cuda.device_count() if cuda_count is None else cuda_count
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    ordinal = int(setting.partition(":")[2]) if ":" in setting else local_rank
    if not 0 <= ordinal < count:
        why = "" if ":" in setting else f" (local rank {local_rank}: one GPU per local rank)"
        raise DeviceError(f"device {setting!r}: no cuda:{ordinal}, this process sees {count}{why}")
    return torch.device("cuda", ordinal)


def process_group_backend(device: torch.device | str) -> str:
    """The ``init_process_group`` backend for ranks on ``device``.

    On a GPU, NCCL carries CUDA tensors (DDP's gradients) and gloo the CPU tensors the pipeline
    reduces (tallies, sums, objects); on the CPU, gloo alone.
    """
    return "cpu:gloo,cuda:nccl" if torch.device(device).type == "cuda" else "gloo"


def wants_pinned_memory(device: torch.device | str) -> bool:
    """Whether a loader feeding ``device`` should pin its batches: only for CUDA, where a pinned
    host buffer is what lets ``to(device, non_blocking=True)`` copy while the GPU computes."""
    return torch.device(device).type == "cuda"


def tensor_to(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``, copied without making the host wait for the GPU.

    A copy to CUDA from pageable host memory waits for the stream; from page-locked memory it
    is queued behind the GPU's work. So a host tensor that is not pinned yet (a mask made from
    strings, say) is pinned first: one host copy, cheaper than a stall on every step.
    """
    target = torch.device(device)
    if target.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(target, non_blocking=True)


def to_device(batch: Mapping[str, Any], device: torch.device | str) -> dict[str, Any]:
    """``batch`` with every tensor on ``device`` (:func:`tensor_to`), everything else as it was.

    Ids and other string columns stay Python lists on the host: a device holds no strings, and
    an id is matched and reconciled as the string the manifest binds.
    """
    return {k: tensor_to(v, device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def cpu_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's weights as CPU tensors of their own, for a checkpoint.

    ``torch.save`` records where each tensor lives, so a state dict taken on a GPU would make
    the checkpoint's bytes (and digest) depend on the device that trained it; a copy on the
    CPU does not.
    """
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
