"""How the reference trainer turns batches into model input: encodings, masks, targets.

Which columns are features is :mod:`pipeline.training.columns`'s; the normalisation, classes and
vocabularies come from the fitting pass (:mod:`pipeline.training.feature_fit`).

A number (any numeric scalar or fixed-size list) is standardised. A string is a category: a
vocabulary of at most ``one_hot_max`` values is one-hot encoded, a larger one embedded (the
model looks each value up, :class:`~pipeline.training.model.MLP`); a value outside the
vocabulary — unseen in the training split — is the all-zero encoding, and counted. A missing
value (null, or NaN in a float) is filled with the training mean (a number) or the all-zero
encoding (a category), and a nullable feature gets a validity indicator beside it, so a null
never crashes a batch and never hides in a fill value; how many were filled is counted per
feature (``docs/reference-trainer.md``).
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer
from torch import nn

from pipeline.bundle.ids import hash64
from pipeline.readers.index import Index
from pipeline.readers.tensors import POSITION_KEY, VALID_SUFFIX
from pipeline.training.columns import Task
from pipeline.training.trainer import TrainerError

#: How a feature column enters the model: its values standardised, or (a string column) its
#: category one-hot encoded or embedded.
Encoding = Literal["value", "one_hot", "embedding"]


class FeatureColumn(BaseModel):
    """One feature column: its width in the model's input, whether it carries a validity
    indicator, and for a category its encoding and vocabulary (sorted)."""

    model_config = ConfigDict(frozen=True)

    name: str
    #: numbers per row; for a category the one-hot slots or the embedding's size
    width: int
    nullable: bool
    encoding: Encoding = "value"
    vocabulary: list[str] = []

    @model_serializer(mode="wrap")
    def _numbers_as_before(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A number column is stored as it was before categories existed, so an existing config
        # writes the same checkpoint bytes (and digest) as it always did.
        data = handler(self)
        if self.encoding == "value":
            data.pop("encoding", None)
            data.pop("vocabulary", None)
        return data

    @property
    def is_category(self) -> bool:
        """Whether the column is a string category (one-hot or embedded)."""
        return self.encoding != "value"


class SpecTensors(NamedTuple):
    """A :class:`FeatureSpec`'s constants on one device."""

    mean: torch.Tensor
    std: torch.Tensor
    classes: torch.Tensor | None  # integer classes, sorted; None for string classes
    mean32: torch.Tensor  # for columns stored as 32 bits or fewer: standardised in float32
    std32: torch.Tensor


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
        """Width of the model's input: every value, one-hot slot and embedding, plus one
        indicator per nullable column."""
        return sum(c.width + c.nullable for c in self.columns)

    @property
    def embeddings(self) -> list[tuple[int, int]]:
        """``(codes, size)`` of each embedded column, in column order: its vocabulary plus the
        unknown code 0, and the embedding's width."""
        return [(len(c.vocabulary) + 1, c.width) for c in self.columns if c.encoding == "embedding"]

    @property
    def outputs(self) -> int:
        """Model outputs: one logit per class, or the one regressed value."""
        return len(self.classes) if self.task == "classification" else 1


@functools.lru_cache(maxsize=16)
def _spec_tensors(
    mean: tuple[float, ...], std: tuple[float, ...], classes: tuple, device: torch.device
) -> SpecTensors:
    ints = bool(classes) and not isinstance(classes[0], str)
    mean64 = torch.tensor(mean, dtype=torch.float64, device=device)
    std64 = torch.tensor(std, dtype=torch.float64, device=device)
    return SpecTensors(
        mean64,
        std64,
        torch.tensor(classes, dtype=torch.int64, device=device) if ints else None,
        mean64.to(torch.float32),
        std64.to(torch.float32),
    )


def number_values(
    batch: Mapping[str, Any], col: FeatureColumn
) -> tuple[torch.Tensor, torch.Tensor]:
    """A column as float64 ``[B, width]`` and a ``[B, width]`` mask of usable values."""
    t = batch[col.name]
    return t.to(torch.float64).reshape(t.shape[0], col.width), usable_values(batch, col)


def usable_values(batch: Mapping[str, Any], col: FeatureColumn) -> torch.Tensor:
    """A column's ``[B, width]`` mask of usable values (not NaN, not null), read from the
    values as stored."""
    t = batch[col.name]
    x = t.reshape(t.shape[0], col.width)
    ok = ~torch.isnan(x) if x.is_floating_point() else torch.ones_like(x, dtype=torch.bool)
    valid = batch.get(col.name + VALID_SUFFIX)
    if valid is not None:
        ok &= valid.reshape(-1, 1)
    return ok


def all_usable(batch: Mapping[str, Any], col: FeatureColumn) -> bool:
    """Whether :func:`usable_values` would be all true, found without building the mask (the
    common case: the fitting pass then sums the column as it is)."""
    valid = batch.get(col.name + VALID_SUFFIX)
    if valid is not None and not bool(valid.all()):
        return False
    t = batch[col.name]
    # NaN spreads through a sum; so does inf - inf, which then takes the masked path: the same
    return not t.is_floating_point() or not bool(torch.isnan(t.sum()))


def labels(batch: Mapping[str, Any], label: str) -> tuple[list | torch.Tensor, torch.Tensor]:
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


def category_values(batch: Mapping[str, Any], col: FeatureColumn) -> pa.Array:
    """A string column of a batch as Arrow (the readers hand strings over as a list)."""
    values = batch[col.name]
    return values if isinstance(values, pa.Array) else pa.array(values, pa.string())


def as_bools(arr: pa.Array) -> torch.Tensor:
    return torch.from_numpy(arr.to_numpy(zero_copy_only=False).astype(np.bool_))


@dataclass
class ValueCounts:
    """Values a pass filled (missing) and found outside a vocabulary (unseen), per feature
    (numbers' counts stay tensors on their device until read with ``int``)."""

    filled: dict[str, int | torch.Tensor] = field(default_factory=dict)
    unseen: dict[str, int] = field(default_factory=dict)


def _category_codes(
    batch: dict, col: FeatureColumn, counts: ValueCounts | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's code (0: null or unseen; ``i + 1``: the vocabulary's ``i``-th value) and
    whether the row has a value, on the host."""
    values = category_values(batch, col)
    index = pc.index_in(values, value_set=pa.array(col.vocabulary, pa.string()))
    present = values.is_valid()
    if counts is not None:
        counts.filled[col.name] = counts.filled.get(col.name, 0) + values.null_count
        unseen = index.null_count - values.null_count
        counts.unseen[col.name] = counts.unseen.get(col.name, 0) + unseen
    codes = pc.add(pc.fill_null(index.cast(pa.int64()), -1), 1)
    return torch.from_numpy(codes.to_numpy(zero_copy_only=False)), as_bools(present)


def _device_of(batch: dict, spec: FeatureSpec) -> torch.device:
    for col in spec.columns:
        value = batch.get(col.name)
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def to_features(
    batch: dict,
    spec: FeatureSpec,
    *,
    device: torch.device | str | None = None,
    counts: ValueCounts | None = None,
) -> torch.Tensor:
    """The float32 model input: standardised numbers with missing values at the mean, one-hot
    categories, indicators beside nullable columns, and last each embedded column's code.

    An embedded column travels as its code (exact in float32 far beyond any vocabulary
    ``max_categories`` allows), so the model takes one tensor and looks it up itself. Computed
    on ``device`` (default: where the batch's numbers are); ``counts`` gains what was filled
    and unseen.
    """
    device = _device_of(batch, spec) if device is None else torch.device(device)
    parts, codes, start = [], [], 0
    constants = spec.tensors(device)
    for col in spec.columns:
        if col.is_category:
            code, present = _category_codes(batch, col, counts)
            code = code.to(device)
            if col.encoding == "one_hot":  # slot 0 (null, unseen) is dropped: all zeros
                parts.append(
                    nn.functional.one_hot(code, len(col.vocabulary) + 1)[:, 1:].to(torch.float32)
                )
            else:
                codes.append(code.to(torch.float32).reshape(-1, 1))
            if col.nullable:
                parts.append(present.to(device).to(torch.float32).reshape(-1, 1))
            continue
        where = slice(start, start + col.width)
        needs_ok = counts is not None or col.nullable
        x, ok = _standardised(batch, col, constants, where, needs_ok=needs_ok)
        if counts is not None:  # a tensor on the device: read once, at the end of the pass
            counts.filled[col.name] = counts.filled.get(col.name, 0) + (~ok).sum()
        parts.append(x)
        if col.nullable:
            parts.append(ok.all(dim=1, keepdim=True).to(torch.float32))
        start += col.width
    out = parts + codes
    return out[0] if len(out) == 1 else torch.cat(out, dim=1)


#: stored widths a float32 holds exactly: standardised in float32, with no float64 copy
_NARROW = (torch.float32, torch.float16, torch.bfloat16)


def _standardised(
    batch: dict, col: FeatureColumn, constants: SpecTensors, where: slice, *, needs_ok: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """A number column standardised as float32 ``[B, width]``, missing values at the mean
    (0), and the ``[B, width]`` mask of usable values (an empty tensor unless ``needs_ok``).

    Wider columns (float64, integers) are standardised in float64 and then rounded, so a
    timestamp or a large count keeps its precision; narrower floats are exact in float32 and
    are standardised there, without a float64 copy of every value.
    """
    t = batch[col.name]
    if t.dtype not in _NARROW:
        x, ok = number_values(batch, col)
        y = torch.where(ok, (x - constants.mean[where]) / constants.std[where], 0.0)
        return y.to(torch.float32), ok
    x = t.reshape(t.shape[0], col.width).to(torch.float32)
    y = (x - constants.mean32[where]) / constants.std32[where]
    valid = batch.get(col.name + VALID_SUFFIX)
    if not needs_ok and valid is None:  # NaN only where the value is NaN (std is never 0)
        return torch.nan_to_num_(y, nan=0.0, posinf=math.inf, neginf=-math.inf), y[:0]
    ok = usable_values(batch, col)
    return y.masked_fill_(~ok, 0.0), ok


def incomplete_rows(
    batch: dict, spec: FeatureSpec, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """A ``[B]`` mask of the rows missing a feature value (a null, or NaN in a float); an
    unseen category is a value, not a missing one."""
    device = _device_of(batch, spec) if device is None else torch.device(device)
    rows = len(next(iter(batch.values())))
    out = torch.zeros(rows, dtype=torch.bool, device=device)
    for col in spec.columns:
        if col.is_category:
            out |= as_bools(category_values(batch, col).is_null()).to(device)
        else:
            out |= ~usable_values(batch, col).all(dim=1)
    return out


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
    return torch.from_numpy(holdout_flags(pa.array(ids, type=pa.string()), percent))


def holdout_flags(ids: pa.Array | pa.ChunkedArray, percent: int) -> np.ndarray:
    """:func:`holdout_mask` over an Arrow array of ids, as numpy booleans."""
    if percent == 0 or len(ids) == 0:
        return np.zeros(len(ids), dtype=np.bool_)
    return (hash64(ids) % np.uint64(100)).astype(np.int64) < percent


#: each live index's hold-out flags, per percent: computed once, dropped with the index
_BY_INDEX: weakref.WeakKeyDictionary[Index, dict[int, np.ndarray]] = weakref.WeakKeyDictionary()


def index_holdout(index: Index, percent: int) -> np.ndarray:
    """Every item of ``index`` held out or not, by index position: the rule of
    :func:`holdout_mask`, hashed once over the index's ids and then kept beside the index."""
    per = _BY_INDEX.setdefault(index, {})
    if percent not in per:
        per[percent] = holdout_flags(index.ids, percent)
    return per[percent]


def batch_holdout(batch: Mapping[str, Any], index: Index, percent: int) -> torch.Tensor:
    """Which rows of a batch are held out (a ``[B]`` mask on the host): looked up by the rows'
    index positions (:data:`~pipeline.readers.tensors.POSITION_KEY`), which every reader's
    batch carries; hashed from the ids for a batch without them. Both give the same rows."""
    positions = batch.get(POSITION_KEY)
    if positions is None or percent == 0:
        return holdout_mask(batch[index.id_field], percent)
    pos = positions.numpy() if isinstance(positions, torch.Tensor) else np.asarray(positions)
    return torch.from_numpy(index_holdout(index, percent)[pos])
