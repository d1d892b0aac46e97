"""Fault injection for the local Compute: lost items and parts, failures, flaky status, slowness.

A real batch service loses work to crashed workers and answers status calls with transient
errors; the local one does the same on request so PARTIAL handling is tested against the real
thing. Which items are lost is a pure function of (ids, attempt) through ``pipeline.bundle.digest``,
never Python's salted ``hash()``, so every process and every rerun loses the same items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from pipeline.bundle.digest import sha256_bytes


class FaultSpec(BaseModel):
    """Which faults a job suffers; the default is a healthy job.

    ``lose_fraction`` and ``lose_parts`` apply to the first attempt, ``resubmit_lose_fraction``
    to every resubmission, ``fail`` makes the first attempt fail outright. ``fail_item_fraction``
    of the computed items fail individually (a per-item error: they get a result row with
    ``lithi_status`` failed, unlike lost items, which get none).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    lose_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    lose_parts: int = Field(default=0, ge=0)
    resubmit_lose_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    fail: bool = False
    fail_item_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    transient_status_errors: int = Field(default=0, ge=0)
    delay_seconds: float = Field(default=0.0, ge=0.0)


def _rank_key(item_id: str, attempt: int, salt: str) -> str:
    return sha256_bytes(f"{salt}\x00{attempt}\x00{item_id}".encode())


def lost_items(ids: Sequence[str], fraction: float, attempt: int) -> set[str]:
    """The ``ceil(fraction * len(ids))`` ids with the smallest sha256(id, attempt): lost ones.

    Rounding up means any fraction above zero loses at least one item, so "every resubmission
    also loses items" holds even when few items are left.
    """
    if fraction <= 0 or not ids:
        return set()
    n = min(len(ids), math.ceil(fraction * len(ids)))
    return set(sorted(ids, key=lambda i: _rank_key(i, attempt, "lose"))[:n])


def failed_items(ids: Sequence[str], fraction: float) -> set[str]:
    """The ``round(fraction * len(ids))`` ids whose computation fails, chosen by sha256(id)."""
    if fraction <= 0 or not ids:
        return set()
    n = min(len(ids), round(fraction * len(ids)))
    return set(sorted(ids, key=lambda i: _rank_key(i, 0, "fail"))[:n])


def lost_blocks(n_blocks: int, lose: int, attempt: int) -> set[int]:
    """Which of ``n_blocks`` whole parts a crashed worker loses (chosen by sha256, not hash())."""
    if lose <= 0 or n_blocks == 0:
        return set()
    ranked = sorted(range(n_blocks), key=lambda b: _rank_key(str(b), attempt, "part"))
    return set(ranked[: min(lose, n_blocks)])
