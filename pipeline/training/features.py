"""How a batch becomes model input: which columns, their normalisation, the classes, the hold-out.

Features are chosen from the manifest's declared schema, never from the data, and the
normalisation is fitted once on the accepted rows; the hold-out split is a pure function of each
item's id, so every process and every rerun holds out the same items.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from pydantic import BaseModel, ConfigDict

from pipeline.bundle import format as fmt
from pipeline.bundle.digest import sha256_bytes
from pipeline.bundle.manifest import Schema
from pipeline.readers.index import Index
from pipeline.readers.tensors import VALID_SUFFIX

_NUMERIC = "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64".split()
EXCLUDED_BY_DEFAULT = ("label",)  # a ground-truth column is never a feature


class FeatureSpec(BaseModel):
    """How a batch becomes a feature matrix: columns, widths, normalisation, and the classes."""

    model_config = ConfigDict(frozen=True)

    columns: list[str]
    widths: list[int]
    mean: list[float]
    std: list[float]
    classes: list[int]
    target_column: str

    @property
    def dim(self) -> int:
        """Width of the feature vector."""
        return sum(self.widths)


def feature_columns(schema: Schema, id_field: str, target: str) -> list[str]:
    """Every numeric scalar or fixed-size-list column that is not the id, a result or the target."""
    out = []
    for f in schema.fields:
        if f.name in (id_field, target) or f.name.startswith(fmt.LITHI_PREFIX):
            continue
        if f.name in EXCLUDED_BY_DEFAULT:
            continue
        base = f.type
        if base.startswith("fixed_size_list<"):
            base = base[len("fixed_size_list<") :].split(",")[0]
        if base in _NUMERIC:
            out.append(f.name)
    return out


def _flat(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column as a float64 matrix [rows, width], nulls as NaN."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_fixed_size_list(arr.type):
        width = arr.type.list_size
        values = arr.flatten().cast(pa.float64()).to_numpy(zero_copy_only=False)
        m = values.reshape(-1, width)
        if arr.null_count:
            m = m.copy()
            m[~arr.is_valid().to_numpy(zero_copy_only=False)] = np.nan
        return m
    return arr.cast(pa.float64()).to_numpy(zero_copy_only=False).reshape(-1, 1)


def fit_spec(index: Index, target_column: str, columns: list[str] | None = None) -> FeatureSpec:
    """Choose features from the manifest and fit their normalisation on the accepted rows."""
    schema = index.schema
    cols = columns or feature_columns(schema, index.id_field, target_column)
    if not cols:
        raise ValueError(f"no numeric feature columns in {schema.names}")
    for name in [*cols, target_column]:
        schema.field(name)  # KeyError naming the declared columns
    read = [*cols, target_column, fmt.STATUS_COLUMN]
    tables = [pq.read_table(p, columns=read) for p in index.part_paths]
    table = pa.concat_tables(tables)
    accepted = pc.equal(table.column(fmt.STATUS_COLUMN), "accepted").fill_null(False)
    table = table.filter(accepted)
    mats = [_flat(table.column(c)) for c in cols]
    x = np.concatenate(mats, axis=1) if mats else np.zeros((0, 0))
    mean = np.nanmean(x, axis=0) if len(x) else np.zeros(x.shape[1])
    std = np.nanstd(x, axis=0) if len(x) else np.ones(x.shape[1])
    std = np.where(np.isfinite(std) & (std > 1e-8), std, 1.0)
    mean = np.where(np.isfinite(mean), mean, 0.0)
    target = table.column(target_column).drop_null()
    classes = sorted(int(v) for v in pc.unique(target).to_pylist())
    if len(classes) < 2:
        raise ValueError(f"need at least two classes in {target_column!r}, found {classes}")
    return FeatureSpec(
        columns=cols,
        widths=[m.shape[1] for m in mats],
        mean=mean.tolist(),
        std=std.tolist(),
        classes=classes,
        target_column=target_column,
    )


def to_features(batch: dict, spec: FeatureSpec) -> torch.Tensor:
    """The normalised float32 feature matrix of a batch; missing values become the mean (0)."""
    parts = []
    for name in spec.columns:
        t = batch[name]
        t = t.to(torch.float32)
        parts.append(t.reshape(t.shape[0], -1))
    x = torch.cat(parts, dim=1)
    x = (x - torch.tensor(spec.mean, dtype=torch.float32)) / torch.tensor(
        spec.std, dtype=torch.float32
    )
    return torch.nan_to_num(x, nan=0.0)


def class_targets(batch: dict, spec: FeatureSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Class indices of the target and a mask of rows that have a known class."""
    raw = batch[spec.target_column]
    raw = raw.to(torch.int64) if isinstance(raw, torch.Tensor) else torch.tensor(raw)
    valid = batch.get(spec.target_column + VALID_SUFFIX)
    valid = valid if valid is not None else torch.ones_like(raw, dtype=torch.bool)
    classes = torch.tensor(spec.classes, dtype=torch.int64)
    idx = torch.searchsorted(classes, raw).clamp(max=len(classes) - 1)
    return idx, valid & (classes[idx] == raw)


def holdout_mask(ids: list[str], percent: int) -> torch.Tensor:
    """Which items are held out: a pure function of the id's sha256, never of a seed or a hash()."""
    if percent == 0:
        return torch.zeros(len(ids), dtype=torch.bool)
    return torch.tensor(
        [int(sha256_bytes(i.encode())[:8], 16) % 100 < percent for i in ids], dtype=torch.bool
    )
