"""Sample data sets shaped as Compute inputs: two from scikit-learn (no download), one synthetic.

Two differently shaped sets prove the chain takes ids and features from the manifest, not from
code: ``digits`` (1,797 8x8 images, one ``fixed_size_list<float32,64>`` column, ids like
``digit-00042``) and ``wine`` (178 samples, 13 scalar ``float64`` columns, ids like ``W/0001``).

Each set has an input table (every item, no labels) and a labelled reference table for the kNN
labeller. The reference is a deterministic subset of the same items (chosen by sha256 of the id,
not by a seed), so the input is the whole data set as shipped; accuracy claims should be measured
on the input items outside the reference, against ``Sample.truth``.

``synthetic`` is for scale (tests, ``bench/chain.py``): any number of items, generated and staged
one record batch at a time so ten million items never sit in memory (see :func:`stage_synthetic`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.bundle.digest import sha256_bytes
from pipeline.bundle.stage import ROW_GROUP_ROWS, new_version_id, stage
from pipeline.bundle.verify import VerifiedSnapshot
from resources.compute.client import JobSpec
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.compute.local.labeller import REFERENCE_LABEL_COLUMN


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


# -- synthetic: any number of items, never all in memory -----------------------------------------

SYNTHETIC = "synthetic"
SYNTHETIC_ID_FIELD = "item_id"
SYNTHETIC_FEATURE = "embedding"
SYNTHETIC_DIM = 64
SYNTHETIC_CLASSES = 10
#: Spread of the class centres (per coordinate) against unit noise: about 95% of the items lie
#: nearer their own centre than any other, so the classes are learnable but not trivial.
SYNTHETIC_SEPARATION = 0.45
#: The labelled reference: the first items, a fixed number, so labelling stays linear in N.
SYNTHETIC_REFERENCE_ITEMS = 4096
#: Items generated (and held) at once; also the parts' row-group size.
SYNTHETIC_BATCH = ROW_GROUP_ROWS
#: Rows per part of the synthetic bundles: enough parts for two ranks from 10^5 items up.
SYNTHETIC_ROWS_PER_PART = 65_536
#: Every sample name the demo accepts.
SAMPLE_NAMES = (*SAMPLES, SYNTHETIC)
_ID_DIGITS = 10


def synthetic_schema(*, labelled: bool = False) -> pa.Schema:
    """``item_id`` string, ``embedding`` ``fixed_size_list<float32,64>`` (and ``label`` int64)."""
    fields = [
        pa.field(SYNTHETIC_ID_FIELD, pa.string(), nullable=False),
        pa.field(SYNTHETIC_FEATURE, pa.list_(pa.float32(), SYNTHETIC_DIM), nullable=False),
    ]
    if labelled:
        fields.append(pa.field(REFERENCE_LABEL_COLUMN, pa.int64(), nullable=False))
    return pa.schema(fields)


def synthetic_ids(start: int, stop: int) -> pa.Array:
    """The ids of items ``start..stop-1``: ``syn-0000000042``, vectorised (no Python strings)."""
    digits = pc.utf8_lpad(
        pa.array(np.arange(start, stop, dtype=np.int64)).cast(pa.string()), _ID_DIGITS, "0"
    )
    return pc.binary_join_element_wise("syn-", digits, "")


def _centres(seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0xC3])
    return (rng.standard_normal((SYNTHETIC_CLASSES, SYNTHETIC_DIM)) * SYNTHETIC_SEPARATION).astype(
        np.float32
    )


def synthetic_classes(start: int, stop: int, *, seed: int = 0) -> np.ndarray:
    """The true class of items ``start..stop-1`` (any range), without generating embeddings.

    Each batch of :data:`SYNTHETIC_BATCH` items has its own generators for classes and noise,
    seeded by ``(seed, batch)``, so any item's class can be recomputed from its number alone.
    """
    out = []
    for b in range(
        start // SYNTHETIC_BATCH, (stop - 1) // SYNTHETIC_BATCH + 1 if stop > start else 0
    ):
        lo = b * SYNTHETIC_BATCH
        cls = np.random.default_rng([seed, b, 1]).integers(0, SYNTHETIC_CLASSES, SYNTHETIC_BATCH)
        out.append(cls[max(start, lo) - lo : min(stop, lo + SYNTHETIC_BATCH) - lo])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def synthetic_batches(
    items: int, *, seed: int = 0, labelled: bool = False, stop: int | None = None
) -> Iterator[pa.RecordBatch]:
    """Items ``0..items-1`` (or ``..stop-1``) as record batches, one batch in memory at a time.

    Item ``i`` belongs to class ``synthetic_classes(i)``; its embedding is that class's centre
    plus unit Gaussian noise, so the classes are learnable from the embedding alone.
    """
    centres = _centres(seed)
    schema = synthetic_schema(labelled=labelled)
    stop = items if stop is None else min(stop, items)
    for lo in range(0, stop, SYNTHETIC_BATCH):
        b, n = lo // SYNTHETIC_BATCH, min(SYNTHETIC_BATCH, stop - lo)
        cls = synthetic_classes(lo, lo + n, seed=seed)
        noise = np.random.default_rng([seed, b, 2]).standard_normal(
            (SYNTHETIC_BATCH, SYNTHETIC_DIM), dtype=np.float32
        )[:n]
        emb = centres[cls] + noise
        arrays = [
            synthetic_ids(lo, lo + n),
            pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), SYNTHETIC_DIM),
        ]
        if labelled:
            arrays.append(pa.array(cls, type=pa.int64()))
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def stage_synthetic(
    items: int,
    root: str | os.PathLike[str],
    *,
    seed: int = 0,
    rows_per_part: int = SYNTHETIC_ROWS_PER_PART,
) -> tuple[VerifiedSnapshot, VerifiedSnapshot]:
    """Stage ``items`` synthetic items, and their first ``SYNTHETIC_REFERENCE_ITEMS`` labelled.

    The input streams from the generator into the staging writer batch by batch, so memory is
    one batch however large ``items`` is. Returns ``(input, reference)`` verified snapshots.
    """
    if items < 1:
        raise ValueError(f"items must be >= 1, got {items}")
    root = Path(root)
    out = []
    for labelled, stop in ((False, None), (True, SYNTHETIC_REFERENCE_ITEMS)):
        version = new_version_id("input")
        out.append(
            stage(
                synthetic_batches(items, seed=seed, labelled=labelled, stop=stop),
                root / version,
                schema=synthetic_schema(labelled=labelled),
                id_field=SYNTHETIC_ID_FIELD,
                kind="input",
                rows_per_part=rows_per_part,
                version_id=version,
            )
        )
    return out[0], out[1]


def synthetic_truth_accuracy(table: pa.Table, *, seed: int = 0) -> tuple[float, int]:
    """Accuracy of ``table``'s ``prediction`` column against the true classes, for the items
    outside the labelled reference (which the labeller saw); also how many items that is."""
    numbers = pc.utf8_slice_codeunits(table[SYNTHETIC_ID_FIELD], 4).cast(pa.int64()).to_numpy()
    held = numbers >= SYNTHETIC_REFERENCE_ITEMS
    if not held.any():
        return float("nan"), 0
    numbers = numbers[held]
    predicted = table["prediction"].to_numpy(zero_copy_only=False)[held]
    right = 0
    order = np.argsort(numbers)
    for lo in range(0, len(order), SYNTHETIC_BATCH * 16):  # bounded memory for the truth
        idx = order[lo : lo + SYNTHETIC_BATCH * 16]
        first, last = int(numbers[idx[0]]), int(numbers[idx[-1]]) + 1
        truth = synthetic_classes(first, last, seed=seed)
        right += int((truth[numbers[idx] - first] == predicted[idx]).sum())
    return right / len(numbers), len(numbers)


def sample_features(name: str) -> list[str]:
    """The feature columns of sample ``name`` (what the demo trains on by default)."""
    if name == SYNTHETIC:
        return [SYNTHETIC_FEATURE]
    return load(name).features


def stage_sample(
    name: str,
    root: str | os.PathLike[str],
    *,
    rows_per_part: int = 256,
    items: int | None = None,
) -> tuple[VerifiedSnapshot, VerifiedSnapshot]:
    """Stage sample ``name``'s input and reference as kind "input" bundles under ``root``.

    Each lands in ``root/<version_id>``; returns ``(input, reference)`` verified snapshots.
    ``items`` sizes the synthetic sample (and is refused for the others, whose size is fixed).
    """
    if name == SYNTHETIC:
        return stage_synthetic(items or 10_000, root)
    if items is not None:
        raise ValueError(f"sample {name!r} has a fixed size; only {SYNTHETIC!r} takes items")
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


def submit_sample_job(
    sample: str,
    home: Path,
    faults: FaultSpec,
    *,
    compute_root: Path | None = None,
    job_id: str | None = None,
    executor: str = "subprocess",
    items: int | None = None,
) -> tuple[str, LocalCompute]:
    """Stage a sample's input and reference bundles and submit a labelling job over them.

    The bundles are staged under ``home/inputs``; the job runs on the local Compute at
    ``compute_root`` (default ``home/compute``). The synthetic sample (``items`` of them) is
    labelled by the centroid labeller, whose cost is linear in the items, in large parts.
    """
    inp, ref = stage_sample(sample, home / "inputs", items=items)
    scale = (
        {"labeller": "centroid", "rows_per_part": SYNTHETIC_ROWS_PER_PART}
        if sample == SYNTHETIC
        else {}
    )
    compute = LocalCompute(compute_root or home / "compute", executor)  # type: ignore[arg-type]
    job_id = job_id or f"{sample}-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    compute.submit(
        JobSpec(
            input_url=str(inp.root),
            reference_url=str(ref.root),
            job_id=job_id,
            idempotency_key=job_id,
            faults=faults,
            **scale,
        )
    )
    return job_id, compute
