"""How the reference trainer turns batches into model input: chosen columns, masks, targets.

Features are chosen from the manifest's declared schema — named explicitly, or chosen
automatically only when asked, with every column left out recorded with its reason — never
guessed from the data; a column no model can take is refused before any work, in one line
naming it, its type and what would work (:func:`choose_features`). Normalisation, the classes
and each string feature's vocabulary are fitted in one pass over the readers (summed across
ranks), so the input is read the way training reads it, never whole into memory.

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

import difflib
import functools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer
from torch import nn

from pipeline.bundle import format as fmt
from pipeline.bundle.ids import hash64
from pipeline.bundle.manifest import Schema, SchemaField
from pipeline.readers.batches import accepted_mask
from pipeline.readers.tensors import VALID_SUFFIX
from pipeline.training.trainer import FeatureSet, TrainerError

Task = Literal["classification", "regression"]
#: How a feature column enters the model: its values standardised, or (a string column) its
#: category one-hot encoded or embedded.
Encoding = Literal["value", "one_hot", "embedding"]

_NUMERIC = set(fmt.NUMERIC_TYPES)
_INTEGER_LABELS = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"}
_FLOATS = set(fmt.FLOAT_TYPES)


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
    return SpecTensors(
        torch.tensor(mean, dtype=torch.float64, device=device),
        torch.tensor(std, dtype=torch.float64, device=device),
        torch.tensor(classes, dtype=torch.int64, device=device) if ints else None,
    )


#: A string feature is a category. (Binary stays out: a vocabulary is stored as JSON text.)
_CATEGORY = "string"
#: Columns named in a refusal as ones that would work, at most.
_SHOWN = 12


def _base_type(f: SchemaField) -> tuple[str, int] | None:
    """``(scalar type, width)`` of a column usable as a number feature, else ``None``."""
    if f.width is None or f.element not in _NUMERIC:  # a list<T> has no fixed width
        return None
    return f.element, f.width


def _usable(f: SchemaField) -> bool:
    return f.type == _CATEGORY or _base_type(f) is not None


def _why_not(f: SchemaField) -> str:
    """Why a declared column cannot be a feature, and what would work: ``<type>: ...``."""
    t = f.type
    text = f.element in ("string", "binary")
    if t == "binary":
        return "binary: bytes are neither numbers nor a category; a string column would work"
    if f.is_list and text:
        return (
            f"{t}: a variable-length list of {f.element} values is no single category; a "
            "string column with one value per row would work"
        )
    if f.is_list:
        return (
            f"{t}: variable length, and the model takes fixed-width input; "
            f"fixed_size_list<{f.element},N> (N values in every row) would work"
        )
    if text:  # a fixed-size list of strings or bytes
        return (
            f"{t}: a list of {f.element} values is no single category; one string column per "
            "position would work"
        )
    return f"{t}: not a numeric feature"


def _why_not_arrow(name: str, dtype: pa.DataType) -> str:
    """Why an Arrow column outside the bundle vocabulary cannot be a feature (a nested struct,
    a map, a union): it cannot even be staged; what would work."""
    if pa.types.is_struct(dtype):
        parts = ", ".join(repr(f"{name}.{dtype.field(i).name}") for i in range(dtype.num_fields))
        return (
            f"{dtype}: nested columns cannot be staged or trained on; flattening it into one "
            f"column per field ({parts}: pyarrow's Table.flatten) would work"
        )
    return (
        f"{dtype}: not a bundle type (docs/bundle-format.md); one column of a numeric or "
        "string type per value would work"
    )


class _Column(NamedTuple):
    """A column of a manifest's or an Arrow schema: its declared field, or (an Arrow type
    outside the vocabulary) ``None`` and why it cannot be used."""

    name: str
    field: SchemaField | None
    refusal: str = ""


def _columns_of(schema: Schema | pa.Schema) -> list[_Column]:
    if isinstance(schema, Schema):
        return [_Column(f.name, f) for f in schema.fields]
    out = []
    for a in schema:
        try:
            out.append(
                _Column(
                    a.name,
                    SchemaField(name=a.name, type=fmt.from_arrow(a.type), nullable=a.nullable),
                )
            )
        except ValueError:  # UnknownType, or a name the manifest would refuse
            out.append(_Column(a.name, None, _why_not_arrow(a.name, a.type)))
    return out


def _not_a_column(what: str, name: str, columns: list[_Column], usable: list[str]) -> TrainerError:
    """``<what> 'x' is not a column of this bundle``: the nearest name, and what would work."""
    near = difflib.get_close_matches(name, [c.name for c in columns], n=1)
    guess = f" (did you mean {near[0]!r}?)" if near else ""
    shown = ", ".join(repr(n) for n in usable[:_SHOWN]) + (", …" if len(usable) > _SHOWN else "")
    return TrainerError(
        f"{what} {name!r} is not a column of this bundle{guess}; columns that would work: "
        f"{shown or 'none'}"
    )


def choose_features(
    schema: Schema | pa.Schema,
    *,
    id_field: str,
    label: str,
    features: list[str],
    auto: bool,
    exclude: Iterable[str] = (),
) -> tuple[list[SchemaField], FeatureSet]:
    """The feature columns, from an explicit list or (``auto``) every numeric declared column.

    ``schema`` is a manifest's (what a bundle declares) or an Arrow schema (a table about to be
    staged). Returns the chosen fields and the :class:`FeatureSet` to record: what was used
    and, in auto mode, every column left out with the reason. An explicit column that does not
    exist or cannot be a feature is a one-line :class:`TrainerError` naming it, its type and
    what would work.
    """
    if bool(features) == auto:
        raise TrainerError(
            "name the feature columns in 'features', or set 'auto_features': true to use every "
            "numeric declared column (not both)"
        )
    columns = _columns_of(schema)
    reserved = {id_field: "the item id", label: "the label"}

    def reserved_why(name: str) -> str | None:
        if name in reserved:
            return reserved[name]
        if name.startswith(fmt.LITHI_PREFIX):
            return "a lithi_* result column"
        return None

    excluded = set(exclude)
    if auto:
        chosen, dropped = [], {}
        for c in columns:
            f = c.field
            if (why := reserved_why(c.name)) is not None:
                dropped[c.name] = why
            elif c.name.endswith(VALID_SUFFIX):
                dropped[c.name] = "a validity mask"
            elif c.name in excluded:
                dropped[c.name] = "excluded by the config"
            elif f is None:
                dropped[c.name] = c.refusal
            elif f.type == _CATEGORY:
                # auto_features chose numbers before categories existed: a config that trained
                # before trains on the same columns (and writes the same checkpoint) now
                dropped[c.name] = (
                    "string: a category; name it in 'features' to use it (auto_features takes "
                    "numeric columns only)"
                )
            elif _base_type(f) is None:
                dropped[c.name] = _why_not(f)
            else:
                chosen.append(f)
        if not chosen:
            raise TrainerError(
                f"auto_features found no numeric column in {[c.name for c in columns]}"
            )
        return chosen, FeatureSet(used=[f.name for f in chosen], dropped=dropped)
    by_name = {c.name: c for c in columns}
    usable = [
        c.name
        for c in columns
        if c.field is not None and reserved_why(c.name) is None and _usable(c.field)
    ]
    chosen = []
    for name in features:
        found = by_name.get(name)
        if found is None:
            raise _not_a_column("feature", name, columns, usable)
        if (why := reserved_why(name)) is not None:
            raise TrainerError(f"feature {name!r} is {why}; it cannot be a feature")
        if found.field is None:
            raise TrainerError(f"feature {name!r} is {found.refusal}")
        if not _usable(found.field):
            raise TrainerError(f"feature {name!r} is {_why_not(found.field)}")
        if found.field in chosen:
            raise TrainerError(f"feature {name!r} is named twice in 'features'; name it once")
        chosen.append(found.field)
    return chosen, FeatureSet(used=list(features))


def check_label(schema: Schema | pa.Schema, label: str, task: Task) -> SchemaField:
    """The label column, refused with the reason if its declared type does not fit ``task``."""
    columns = _columns_of(schema)
    c = next((c for c in columns if c.name == label), None)
    if c is None:
        fitting = [
            x.name for x in columns if x.field is not None and _label_problem(x.field, task) is None
        ]
        raise _not_a_column("label", label, columns, fitting)
    if c.field is None:
        raise TrainerError(f"label {label!r} is {c.refusal}")
    problem = _label_problem(c.field, task)
    if problem is not None:
        raise TrainerError(f"label {label!r} is {problem}")
    return c.field


def _label_problem(f: SchemaField, task: Task) -> str | None:
    if task == "classification":
        if f.type in _FLOATS:
            return (
                f"{f.type}: a classification target must be an integer, bool or string column; "
                "for a continuous target use task 'regression'"
            )
        if f.type not in _INTEGER_LABELS | {"string"}:
            return f"{f.type}: not a class label"
    elif f.type not in _NUMERIC - {"date32", "timestamp[us,UTC]"}:
        return f"{f.type}: a regression target must be numeric"
    return None


def _columns(fields: list[SchemaField]) -> list[FeatureColumn]:
    """The chosen fields as feature columns (each already checked usable by choose_features);
    a category's encoding and vocabulary are filled in once the fitting pass has seen it."""
    columns = []
    for f in fields:
        if f.type == _CATEGORY:
            columns.append(
                FeatureColumn(name=f.name, width=0, nullable=f.nullable, encoding="one_hot")
            )
            continue
        base = _base_type(f)
        if base is None:
            raise TrainerError(f"feature {f.name!r} is {_why_not(f)}")
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


def _categories(batch: dict, col: FeatureColumn) -> pa.Array:
    """A string column of a batch as Arrow (the readers hand strings over as a list)."""
    values = batch[col.name]
    return values if isinstance(values, pa.Array) else pa.array(values, pa.string())


def _bools(arr: pa.Array) -> torch.Tensor:
    return torch.from_numpy(arr.to_numpy(zero_copy_only=False).astype(np.bool_))


def embedding_width(values: int) -> int:
    """The embedding size of a vocabulary of ``values``: fast.ai's ``1.6 n^0.56``, at most 32
    (a tabular category needs few dimensions; more would only fit noise)."""
    return max(1, min(32, round(1.6 * values**0.56)))


def vocabulary(counts: Counter, limit: int) -> tuple[list[str], int]:
    """The ``limit`` most frequent values (ties by value), sorted by value; and how many
    distinct values were left out (they count as unseen)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = sorted(v for v, _ in ranked[:limit])
    return kept, len(ranked) - len(kept)


@dataclass(frozen=True)
class FittedFeatures:
    """What the fitting pass found: the spec, and the missing values it saw among the rows
    used for fitting — per feature, and how many rows miss at least one."""

    spec: FeatureSpec
    missing: dict[str, int]
    incomplete_rows: int
    rows: int
    #: per category column, the distinct training values beyond ``max_categories``
    left_out: dict[str, int] = field(default_factory=dict)


def fit_spec(batches: Iterable[dict], fields: list[SchemaField], **options: Any) -> FeatureSpec:
    """Fit normalisation and classes in one pass over ``batches``: :func:`fit_features`'s spec,
    with the same keyword options."""
    return fit_features(batches, fields, **options).spec


def fit_features(
    batches: Iterable[dict],
    fields: list[SchemaField],
    *,
    task: Task,
    label: str,
    has_status: bool,
    world_size: int = 1,
    id_field: str | None = None,
    holdout_percent: int = 0,
    one_hot_max: int = 16,
    max_categories: int = 10_000,
) -> FittedFeatures:
    """Fit normalisation, classes and vocabularies in one pass over ``batches`` (this rank's
    share), counting the missing values it meets.

    Normalisation and missing values are taken over the rows used for fitting (accepted ones
    in a result bundle); a string feature's vocabulary over the training split alone (those
    rows but the ones held out by id, ``id_field`` and ``holdout_percent``), so a value only a
    held-out row has is unseen, as it would be in new data. A vocabulary of at most
    ``one_hot_max`` values is one-hot encoded, a larger one embedded; it keeps at most
    ``max_categories`` values (:func:`vocabulary`).

    With ``world_size > 1`` the sums, counts, classes and vocabularies are combined across
    ranks (a collective: every rank calls it), so every rank ends with the same spec.
    """
    columns = _columns(fields)
    numbers = [c for c in columns if not c.is_category]
    width = sum(c.width for c in numbers)
    sums = torch.zeros(3, width, dtype=torch.float64)  # count, sum, sum of squares
    target = torch.zeros(3, dtype=torch.float64)
    # missing values per column, then rows missing any, then rows used for fitting
    tally = torch.zeros(len(columns) + 2, dtype=torch.int64)
    classes: set = set()
    seen: dict[str, Counter] = {c.name: Counter() for c in columns if c.is_category}
    for batch in batches:
        rows = _fit_rows(batch, has_status)
        incomplete = torch.zeros_like(rows)
        training = rows
        if seen and id_field is not None and holdout_percent:
            training = rows & ~holdout_mask(batch[id_field], holdout_percent)
        start = 0
        for i, col in enumerate(columns):
            if col.is_category:
                values = _categories(batch, col)
                null = _bools(values.is_null())
                incomplete |= null
                tally[i] += (null & rows).sum()
                kept = values.filter(pa.array(training.numpy())).drop_null()
                for row in pc.value_counts(kept).to_pylist():
                    seen[col.name][row["values"]] += row["counts"]
                continue
            x, ok = _values(batch, col)
            incomplete |= ~ok.all(dim=1)
            tally[i] += (~ok & rows.reshape(-1, 1)).sum()
            ok &= rows.reshape(-1, 1)
            x = torch.where(ok, x, 0.0)
            sums[0, start : start + col.width] += ok.sum(0)
            sums[1, start : start + col.width] += x.sum(0)
            sums[2, start : start + col.width] += (x * x).sum(0)
            start += col.width
        tally[-2] += (incomplete & rows).sum()
        tally[-1] += rows.sum()
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
        dist.all_reduce(tally)
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, (classes, seen))
        classes = set().union(*(g[0] for g in gathered))
        seen = {name: sum((g[1][name] for g in gathered), Counter()) for name in seen}
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
    left_out: dict[str, int] = {}
    for k, col in enumerate(columns):
        if col.is_category:
            values, left_out[col.name] = vocabulary(seen[col.name], max_categories)
            embed = len(values) > one_hot_max
            columns[k] = col.model_copy(
                update={
                    "encoding": "embedding" if embed else "one_hot",
                    "width": embedding_width(len(values)) if embed else len(values),
                    "vocabulary": values,
                }
            )
    spec = FeatureSpec(
        task=task,
        label=label,
        columns=columns,
        mean=mean.tolist(),
        std=std.tolist(),
        classes=sorted(classes),
        target_mean=t_mean,
        target_std=t_std,
    )
    counts = tally.tolist()
    return FittedFeatures(
        spec=spec,
        missing={c.name: counts[i] for i, c in enumerate(columns)},
        incomplete_rows=counts[-2],
        rows=counts[-1],
        left_out={k: v for k, v in left_out.items() if v},
    )


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
    values = _categories(batch, col)
    index = pc.index_in(values, value_set=pa.array(col.vocabulary, pa.string()))
    present = values.is_valid()
    if counts is not None:
        counts.filled[col.name] = counts.filled.get(col.name, 0) + values.null_count
        unseen = index.null_count - values.null_count
        counts.unseen[col.name] = counts.unseen.get(col.name, 0) + unseen
    codes = pc.add(pc.fill_null(index.cast(pa.int64()), -1), 1)
    return torch.from_numpy(codes.to_numpy(zero_copy_only=False)), _bools(present)


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
    mean, std, _ = spec.tensors(device)
    for col in spec.columns:
        if col.is_category:
            code, present = _category_codes(batch, col, counts)
            code = code.to(device)
            if col.encoding == "one_hot":  # slot 0 (null, unseen) is dropped: all zeros
                parts.append(
                    nn.functional.one_hot(code, len(col.vocabulary) + 1)[:, 1:].to(torch.float64)
                )
            else:
                codes.append(code.to(torch.float64).reshape(-1, 1))
            if col.nullable:
                parts.append(present.to(device).to(torch.float64).reshape(-1, 1))
            continue
        x, ok = _values(batch, col)
        if counts is not None:  # a tensor on the device: read once, at the end of the pass
            counts.filled[col.name] = counts.filled.get(col.name, 0) + (~ok).sum()
        m, s = mean[start : start + col.width], std[start : start + col.width]
        parts.append(torch.where(ok, (x - m) / s, 0.0))
        if col.nullable:
            parts.append(ok.all(dim=1, keepdim=True).to(torch.float64))
        start += col.width
    return torch.cat(parts + codes, dim=1).to(torch.float32)


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
            out |= _bools(_categories(batch, col).is_null()).to(device)
        else:
            out |= ~_values(batch, col)[1].all(dim=1)
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


def holdout_flags(ids: pa.Array, percent: int) -> np.ndarray:
    """:func:`holdout_mask` over an Arrow array of ids, as numpy booleans."""
    if percent == 0 or len(ids) == 0:
        return np.zeros(len(ids), dtype=np.bool_)
    return (hash64(ids) % np.uint64(100)).astype(np.int64) < percent
