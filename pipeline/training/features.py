"""How the reference trainer turns batches into model input: chosen columns, masks, targets.

Features are chosen from the manifest's declared schema — named explicitly, or chosen
automatically only when asked, with every column left out recorded with its reason — never
guessed from the data. Normalisation and the classes are fitted in one pass over the readers
(summed across ranks), so the input is read the way training reads it, never whole into memory.
A nullable feature is filled with its mean and gets a validity indicator beside it (the readers'
``<name>__valid`` mask), so a null never crashes a batch and never hides in a fill value.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Literal, NamedTuple

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict

from pipeline.bundle import format as fmt
from pipeline.bundle.ids import hash64
from pipeline.bundle.manifest import Schema, SchemaField
from pipeline.readers.batches import accepted_mask
from pipeline.readers.tensors import VALID_SUFFIX
from pipeline.training.trainer import FeatureSet, TrainerError

Task = Literal["classification", "regression"]

_NUMERIC = set(fmt.NUMERIC_TYPES)
_INTEGER_LABELS = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"}
_FLOATS = set(fmt.FLOAT_TYPES)


class FeatureColumn(BaseModel):
    """One feature column: its width in the feature vector, and whether it carries a mask."""

    model_config = ConfigDict(frozen=True)

    name: str
    width: int
    nullable: bool


class SpecTensors(NamedTuple):
    """A :class:`FeatureSpec`'s constants on one device."""

    mean: torch.Tensor
    std: torch.Tensor
    classes: torch.Tensor | None  # integer classes, sorted; None for string classes


class FeatureSpec(BaseModel):
    """How a batch becomes a feature matrix and a target: columns, normalisation, classes."""

    model_config = ConfigDict(frozen=True)

    task: Task
    label: str
    columns: list[FeatureColumn]
    mean: list[float]
    std: list[float]
    classes: list[int | str] = []
    target_mean: float = 0.0
    target_std: float = 1.0

    def tensors(self, device: torch.device | str) -> SpecTensors:
        """Mean, std and (integer) classes as tensors on ``device``, made once per device and
        set of values: a GPU step then copies no constant from the host (each copy would make
        the host wait). Shared: never change them in place."""
        return _spec_tensors(
            tuple(self.mean), tuple(self.std), tuple(self.classes), torch.device(device)
        )

    @property
    def dim(self) -> int:
        """Width of the feature vector: every value, plus one indicator per nullable column."""
        return sum(c.width + c.nullable for c in self.columns)

    @property
    def outputs(self) -> int:
        """Model outputs: one logit per class, or the one regressed value."""
        return len(self.classes) if self.task == "classification" else 1


@functools.lru_cache(maxsize=16)
def _spec_tensors(
    mean: tuple[float, ...], std: tuple[float, ...], classes: tuple, device: torch.device
) -> SpecTensors:
    ints = bool(classes) and not isinstance(classes[0], str)
    return SpecTensors(
        torch.tensor(mean, dtype=torch.float64, device=device),
        torch.tensor(std, dtype=torch.float64, device=device),
        torch.tensor(classes, dtype=torch.int64, device=device) if ints else None,
    )


def _base_type(f: SchemaField) -> tuple[str, int] | None:
    """``(scalar type, width)`` of a column usable as a feature, else ``None``."""
    if f.width is None or f.element not in _NUMERIC:  # a list<T> has no fixed width
        return None
    return f.element, f.width


def _why_not(f: SchemaField) -> str:
    t = f.type
    if t == "string":
        return "string: text is not a numeric feature (encode it yourself)"
    if t == "binary":
        return "binary: not a numeric feature"
    if f.is_list:
        return f"{t}: variable length, the model takes fixed-width input"
    return f"{t}: not a numeric feature"


def choose_features(
    schema: Schema,
    *,
    id_field: str,
    label: str,
    features: list[str],
    auto: bool,
    exclude: Iterable[str] = (),
) -> tuple[list[SchemaField], FeatureSet]:
    """The feature columns, from an explicit list or (``auto``) every usable declared column.

    Returns the chosen fields and the :class:`FeatureSet` to record: what was used and, in auto
    mode, every column left out with the reason. An explicit column that does not exist or
    cannot be a feature is a :class:`TrainerError` naming it.
    """
    if bool(features) == auto:
        raise TrainerError(
            "name the feature columns in 'features', or set 'auto_features': true to use every "
            "numeric declared column (not both)"
        )
    reserved = {id_field: "the item id", label: "the label"}
    excluded = set(exclude)
    if auto:
        chosen, dropped = [], {}
        for f in schema.fields:
            if f.name in reserved:
                dropped[f.name] = reserved[f.name]
            elif f.name.startswith(fmt.LITHI_PREFIX):
                dropped[f.name] = "a lithi_* result column"
            elif f.name.endswith(VALID_SUFFIX):
                dropped[f.name] = "a validity mask"
            elif f.name in excluded:
                dropped[f.name] = "excluded by the config"
            elif _base_type(f) is None:
                dropped[f.name] = _why_not(f)
            else:
                chosen.append(f)
        if not chosen:
            raise TrainerError(f"auto_features found no numeric column in {schema.names}")
        return chosen, FeatureSet(used=[f.name for f in chosen], dropped=dropped)
    chosen = []
    for name in features:
        try:
            f = schema.field(name)
        except KeyError as e:
            raise TrainerError(str(e).strip("\"'")) from None
        if name in reserved or name.startswith(fmt.LITHI_PREFIX):
            why = reserved.get(name, "a lithi_* result column")
            raise TrainerError(f"feature {name!r} is {why}; it cannot be a feature")
        if _base_type(f) is None:
            raise TrainerError(f"feature {name!r} cannot be used: {_why_not(f)}")
        chosen.append(f)
    return chosen, FeatureSet(used=list(features))


def check_label(schema: Schema, label: str, task: Task) -> SchemaField:
    """The label column, refused with the reason if its declared type does not fit ``task``."""
    try:
        f = schema.field(label)
    except KeyError as e:
        raise TrainerError(str(e).strip("\"'")) from None
    if task == "classification":
        if f.type in _FLOATS:
            raise TrainerError(
                f"label {label!r} is {f.type}: a classification target must be an integer, bool "
                "or string column; for a continuous target use task 'regression'"
            )
        if f.type not in _INTEGER_LABELS | {"string"}:
            raise TrainerError(f"label {label!r} is {f.type}: not a class label")
    elif f.type not in _NUMERIC - {"date32", "timestamp[us,UTC]"}:
        raise TrainerError(f"label {label!r} is {f.type}: a regression target must be numeric")
    return f


def _columns(fields: list[SchemaField]) -> list[FeatureColumn]:
    """The chosen fields as feature columns (each already checked usable by choose_features)."""
    columns = []
    for f in fields:
        base = _base_type(f)
        if base is None:
            raise TrainerError(f"column {f.name!r} is {f.type}: {_why_not(f)}")
        columns.append(FeatureColumn(name=f.name, width=base[1], nullable=f.nullable))
    return columns


def _values(batch: dict, col: FeatureColumn) -> tuple[torch.Tensor, torch.Tensor]:
    """A column as float64 ``[B, width]`` and a ``[B, width]`` mask of usable values."""
    t = batch[col.name]
    x = t.to(torch.float64).reshape(t.shape[0], col.width)
    ok = ~torch.isnan(x)
    valid = batch.get(col.name + VALID_SUFFIX)
    if valid is not None:
        ok &= valid.reshape(-1, 1)
    return x, ok


def labels(batch: dict, label: str) -> tuple[list | torch.Tensor, torch.Tensor]:
    """The label values of a batch and a ``[B]`` mask of rows that have one."""
    raw = batch[label]
    if isinstance(raw, list):  # a string label
        return raw, torch.tensor([v is not None for v in raw], dtype=torch.bool)
    valid = batch.get(label + VALID_SUFFIX)
    if valid is None:
        valid = torch.ones(raw.shape[0], dtype=torch.bool, device=raw.device)
    if raw.is_floating_point():
        valid = valid & ~torch.isnan(raw)
    return raw, valid


def _fit_rows(batch: dict, has_status: bool) -> torch.Tensor:
    """Rows whose values may shape the normalisation: accepted ones in a result bundle."""
    if has_status:
        return accepted_mask(batch)
    return torch.ones(len(next(iter(batch.values()))), dtype=torch.bool)


def fit_spec(
    batches: Iterable[dict],
    fields: list[SchemaField],
    *,
    task: Task,
    label: str,
    has_status: bool,
    world_size: int = 1,
) -> FeatureSpec:
    """Fit normalisation and classes in one pass over ``batches`` (this rank's share).

    With ``world_size > 1`` the sums and the classes are combined across ranks (a collective:
    every rank calls it), so every rank ends with the same spec.
    """
    columns = _columns(fields)
    width = sum(c.width for c in columns)
    sums = torch.zeros(3, width, dtype=torch.float64)  # count, sum, sum of squares
    target = torch.zeros(3, dtype=torch.float64)
    classes: set = set()
    for batch in batches:
        rows = _fit_rows(batch, has_status)
        start = 0
        for col in columns:
            x, ok = _values(batch, col)
            ok &= rows.reshape(-1, 1)
            x = torch.where(ok, x, 0.0)
            sums[0, start : start + col.width] += ok.sum(0)
            sums[1, start : start + col.width] += x.sum(0)
            sums[2, start : start + col.width] += (x * x).sum(0)
            start += col.width
        y, has_y = labels(batch, label)
        keep = rows & has_y
        if task == "classification":
            if isinstance(y, list):  # string labels: Python values by nature
                classes.update(v for v, k in zip(y, keep.tolist(), strict=True) if k)
            else:  # a handful of distinct values per batch, found without a Python loop
                classes.update(torch.unique(y[keep]).tolist())
        elif isinstance(y, torch.Tensor):  # a regression label is numeric (check_label)
            yv = y.to(torch.float64)[keep]
            target += torch.stack([keep.sum().to(torch.float64), yv.sum(), (yv * yv).sum()])
    if world_size > 1:
        dist.all_reduce(sums)
        dist.all_reduce(target)
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, classes)
        classes = set().union(*gathered)
    n = sums[0].clamp(min=1)
    mean = sums[1] / n
    std = (sums[2] / n - mean * mean).clamp(min=0).sqrt()
    std = torch.where(std > 1e-8, std, torch.ones_like(std))
    # a classifier's spec adds its classes, a regressor's its target's normalisation (classes
    # stay empty for a regressor, the target's mean and std 0 and 1 for a classifier)
    t_mean, t_std = 0.0, 1.0
    if task == "classification":
        if len(classes) < 2:
            raise TrainerError(
                f"label {label!r} holds {len(classes)} class(es) among the rows used for "
                "fitting; a classifier needs at least two"
            )
    else:
        if target[0] == 0:
            raise TrainerError(f"label {label!r} has no value among the rows used for fitting")
        tn = target[0].clamp(min=1)
        t_mean = float(target[1] / tn)
        t_std = float((target[2] / tn - t_mean * t_mean).clamp(min=0).sqrt()) or 1.0
    return FeatureSpec(
        task=task,
        label=label,
        columns=columns,
        mean=mean.tolist(),
        std=std.tolist(),
        classes=sorted(classes),
        target_mean=t_mean,
        target_std=t_std,
    )


def to_features(batch: dict, spec: FeatureSpec) -> torch.Tensor:
    """The normalised float32 feature matrix: missing values at the mean, indicators beside.

    Computed on the device the batch's columns are on.
    """
    parts, start = [], 0
    device = batch[spec.columns[0].name].device if spec.columns else torch.device("cpu")
    mean, std, _ = spec.tensors(device)
    for col in spec.columns:
        x, ok = _values(batch, col)
        m, s = mean[start : start + col.width], std[start : start + col.width]
        parts.append(torch.where(ok, (x - m) / s, 0.0))
        if col.nullable:
            parts.append(ok.all(dim=1, keepdim=True).to(torch.float64))
        start += col.width
    return torch.cat(parts, dim=1).to(torch.float32)


def class_targets(batch: dict, spec: FeatureSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Class indices of the label and a mask of rows whose label is a known class."""
    raw, valid = labels(batch, spec.label)
    if isinstance(raw, list) or not spec.classes or isinstance(spec.classes[0], str):
        lookup = {c: i for i, c in enumerate(spec.classes)}
        values = raw if isinstance(raw, list) else raw.tolist()
        index = torch.tensor([lookup.get(v, -1) for v in values], dtype=torch.int64)
        return index.clamp(min=0), valid & (index >= 0)
    # Integer classes are sorted (fit_spec sorts them): a binary search per row, vectorised.
    known = spec.tensors(raw.device).classes
    assert known is not None  # integer classes: the branch above takes string ones
    numbers = raw.to(torch.int64)
    found = torch.searchsorted(known, numbers).clamp(max=len(known) - 1)
    return found, valid & (known[found] == numbers)


def regression_targets(batch: dict, spec: FeatureSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The label standardised by the fitted mean and std, and a mask of rows that have one."""
    raw, valid = labels(batch, spec.label)
    if isinstance(raw, list):
        raise TrainerError(f"label {spec.label!r} holds strings: not a regression target")
    y = raw.to(torch.float64)
    y = torch.where(valid, (y - spec.target_mean) / spec.target_std, 0.0)
    return y.to(torch.float32), valid


def holdout_mask(ids: list[str], percent: int) -> torch.Tensor:
    """Which items are held out: a pure function of each id (a fixed 64-bit hash), never of a
    seed, a position or Python's per-process ``hash()``; vectorised over the batch."""
    if percent == 0 or not ids:
        return torch.zeros(len(ids), dtype=torch.bool)
    h = hash64(pa.array(ids, type=pa.string()))
    return torch.from_numpy((h % np.uint64(100)).astype(np.int64) < percent)
