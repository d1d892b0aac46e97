"""Sample data sets that ship inside scikit-learn (no download), shaped as Compute inputs.

Two differently shaped sets prove the chain takes ids and features from the manifest, not from
code: ``digits`` (1,797 8x8 images, one ``fixed_size_list<float32,64>`` column, ids like
``digit-00042``) and ``wine`` (178 samples, 13 scalar ``float64`` columns, ids like ``W/0001``).

Each set has an input table (every item, no labels) and a labelled reference table for the kNN
labeller. The reference is a deterministic subset of the same items (chosen by sha256 of the id,
not by a seed), so the input is the whole data set as shipped; accuracy claims should be measured
on the input items outside the reference, against ``Sample.truth``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.bundle.digest import sha256_bytes
from pipeline.bundle.stage import new_version_id, stage
from pipeline.bundle.verify import VerifiedSnapshot
from resources.compute.labeller import REFERENCE_LABEL_COLUMN


@dataclass(frozen=True)
class Sample:
    """One sample data set: its id field, its tables, and which items are in the reference."""

    name: str
    id_field: str
    input: pa.Table
    reference: pa.Table
    truth: pa.Table  # id_field, label: the true label of every input item

    @property
    def features(self) -> list[str]:
        """The sample's feature columns (every input column but the id)."""
        return [c for c in self.input.column_names if c != self.id_field]


def _reference_mask(ids: list[str], fraction: float) -> np.ndarray:
    """The ``round(fraction * n)`` ids with the smallest sha256: the labelled reference rows."""
    ranked = sorted(range(len(ids)), key=lambda i: sha256_bytes(f"reference\x00{ids[i]}".encode()))
    mask = np.zeros(len(ids), dtype=bool)
    mask[ranked[: round(fraction * len(ids))]] = True
    return mask


def _build(name, id_field, ids, columns: dict[str, pa.Array], target, fraction) -> Sample:
    id_arr = pa.array(ids, type=pa.string())
    fields = [pa.field(id_field, pa.string(), nullable=False)]
    fields += [pa.field(n, a.type) for n, a in columns.items()]
    table = pa.Table.from_arrays([id_arr, *columns.values()], schema=pa.schema(fields))
    labels = pa.array(np.asarray(target, dtype=np.int64), type=pa.int64())
    mask = pa.array(_reference_mask(ids, fraction))
    label_field = pa.field(REFERENCE_LABEL_COLUMN, pa.int64(), nullable=False)
    reference = table.append_column(label_field, labels)
    truth = pa.table({id_field: id_arr, REFERENCE_LABEL_COLUMN: labels})
    return Sample(name, id_field, table, reference.filter(mask), truth)


def digits() -> Sample:
    """scikit-learn's handwritten digits: ``image_id`` ``digit-NNNNN``, ``pixels`` 64 float32."""
    from sklearn.datasets import load_digits

    d = load_digits()
    ids = [f"digit-{i:05d}" for i in range(len(d.target))]
    flat = pa.array(d.data.astype(np.float32).ravel(), type=pa.float32())
    pixels = pa.FixedSizeListArray.from_arrays(flat, 64)
    return _build("digits", "image_id", ids, {"pixels": pixels}, d.target, 0.12)


def wine() -> Sample:
    """scikit-learn's wine recognition set: ``wine_id`` ``W/NNNN``, 13 scalar float64 columns."""
    from sklearn.datasets import load_wine

    d = load_wine()
    ids = [f"W/{i + 1:04d}" for i in range(len(d.target))]
    cols = {
        n: pa.array(d.data[:, j].astype(np.float64), type=pa.float64())
        for j, n in enumerate(d.feature_names)
    }
    return _build("wine", "wine_id", ids, cols, d.target, 0.25)


SAMPLES: dict[str, Callable[[], Sample]] = {"digits": digits, "wine": wine}


def load(name: str) -> Sample:
    """The sample called ``name``, or ``KeyError`` naming the ones that exist."""
    try:
        return SAMPLES[name]()
    except KeyError:
        raise KeyError(f"no sample {name!r}; samples: {', '.join(SAMPLES)}") from None


def stage_sample(
    name: str, root: str | os.PathLike[str], *, rows_per_part: int = 256
) -> tuple[VerifiedSnapshot, VerifiedSnapshot]:
    """Stage sample ``name``'s input and reference as kind "input" bundles under ``root``.

    Each lands in ``root/<version_id>``; returns ``(input, reference)`` verified snapshots.
    """
    s = load(name)
    root = Path(root)
    out = []
    for table in (s.input, s.reference):
        version = new_version_id("input")
        out.append(
            stage(
                table,
                root / version,
                id_field=s.id_field,
                kind="input",
                rows_per_part=rows_per_part,
                version_id=version,
            )
        )
    return out[0], out[1]
