"""Bundles for the reader tests: any part sizes, string ids with leading zeros, lithi columns."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.bundle.manifest import InputRef, JobInfo
from pipeline.bundle.stage import ReusedPart, stage
from pipeline.bundle.verify import VerifiedSnapshot, verify

STATUS_CYCLE = ("accepted", "accepted", "failed", "abstained")


def result_table(start: int, n: int, width: int = 4) -> pa.Table:
    """Rows ``start..start+n``: ids ``"00042"``, a float feature vector, statuses cycling."""
    i = np.arange(start, start + n)
    status = [STATUS_CYCLE[k % len(STATUS_CYCLE)] for k in i]
    conf = [None if s == "failed" else float(k % 10) / 10 for s, k in zip(status, i, strict=True)]
    feats = (i[:, None] * 10 + np.arange(width)[None, :]).astype(np.float32)
    return pa.table(
        {
            "item_id": pa.array([f"{k:05d}" for k in i], pa.string()),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(feats.ravel()), width),
            "label": pa.array(i % 7, pa.int64()),
            "lithi_status": pa.array(status, pa.string()),
            "lithi_confidence": pa.array(conf, pa.float32()),
            "lithi_verification": pa.array(["checked"] * n, pa.string()),
        }
    )


JOB = JobInfo(job_id="job-1", status="SUCCEEDED", attempt=1)
INPUT = InputRef(version_id="input-1", content_sha256="0" * 64)


def make_bundle(root: Path, sizes: Sequence[int], name: str = "bundle") -> VerifiedSnapshot:
    """A verified result bundle whose parts hold exactly ``sizes`` rows (uneven on purpose)."""
    root.mkdir(parents=True, exist_ok=True)
    reused, start = [], 0
    for k, n in enumerate(sizes):
        # one single-part bundle per size, then bound again (hard links) as parts of the final
        piece = stage(
            result_table(start, n),
            root / f".{name}-piece-{k}",
            id_field="item_id",
            kind="result",
            rows_per_part=max(n, 1),
            job=JOB,
            input=INPUT,
        )
        reused.append(ReusedPart(piece.root, piece.manifest.parts[0]))
        start += n
    empty = result_table(0, 0)
    stage(
        empty,
        root / name,
        id_field="item_id",
        kind="result",
        job=JOB,
        input=INPUT,
        reuse_parts=reused,
    )
    return verify(root / name)
