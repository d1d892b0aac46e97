"""The fitting pass: normalisation, classes and vocabularies from one pass over the readers.

The input is read the way training reads it (this rank's share, summed across ranks), never
whole into memory. What the pass found (:class:`FittedFeatures`) is the spec the model is built
from and the missing values it met, per feature.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist

from pipeline.bundle.manifest import SchemaField
from pipeline.readers.batches import accepted_mask
from pipeline.readers.derive import Derive, Summary
from pipeline.readers.index import Index
from pipeline.training.columns import CATEGORY, Task, number_shape, why_not_a_feature
from pipeline.training.features import (
    FeatureColumn,
    FeatureSpec,
    all_usable,
    as_bools,
    batch_holdout,
    category_values,
    holdout_mask,
    labels,
    number_values,
)
from pipeline.training.trainer import TrainerError


def _columns(fields: list[SchemaField]) -> list[FeatureColumn]:
    """The chosen fields as feature columns (each already checked usable by choose_features);
    a category's encoding and vocabulary are filled in once the fitting pass has seen it."""
    columns = []
    for f in fields:
        if f.type == CATEGORY:
            columns.append(
                FeatureColumn(name=f.name, width=0, nullable=f.nullable, encoding="one_hot")
            )
            continue
        base = number_shape(f)
        if base is None:
            raise TrainerError(f"feature {f.name!r} is {why_not_a_feature(f)}")
        columns.append(FeatureColumn(name=f.name, width=base[1], nullable=f.nullable))
    return columns


def _fit_rows(batch: Mapping[str, Any], has_status: bool) -> torch.Tensor:
    """Rows whose values may shape the normalisation: accepted ones in a result bundle."""
    if has_status:
        return accepted_mask(batch)
    return torch.ones(len(next(iter(batch.values()))), dtype=torch.bool)


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


#: Where a batch the fitting pass reads holds its :class:`FitSums`, summed where it was read.
FIT_SUMS = "__fit_sums"


#: the fields of :class:`FitSums` that are tensors
_TENSORS = ("sums", "target", "tally")


@dataclass
class FitSums:
    """What the fitting pass sums over any number of rows; two combine by :meth:`merge`, so a
    worker can sum what it reads and the main process only add the workers' sums."""

    #: per number slot: rows counted, sum, sum of squares (float64)
    sums: torch.Tensor
    #: the regression target's rows, sum, sum of squares (float64)
    target: torch.Tensor
    #: missing values per column, then rows missing any, then rows used for fitting
    tally: torch.Tensor
    classes: set
    #: per category column, the training rows' values and how often each was seen
    seen: dict[str, Counter]

    @classmethod
    def empty(cls, columns: list[FeatureColumn]) -> FitSums:
        width = sum(c.width for c in columns if not c.is_category)
        return cls(
            sums=torch.zeros(3, width, dtype=torch.float64),
            target=torch.zeros(3, dtype=torch.float64),
            tally=torch.zeros(len(columns) + 2, dtype=torch.int64),
            classes=set(),
            seen={c.name: Counter() for c in columns if c.is_category},
        )

    # Pickled (a worker sends its sums through the loader's pipe) as numpy arrays: a torch
    # tensor would pickle as a shared-memory segment of its own, whose handover costs the
    # worker more than the sums did (docs/performance.md).
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in _TENSORS:
            state[name] = state[name].numpy()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in _TENSORS:
            state[name] = torch.from_numpy(state[name])
        self.__dict__.update(state)

    def merge(self, other: FitSums) -> None:
        """Add ``other``'s rows to these."""
        self.sums += other.sums
        self.target += other.target
        self.tally += other.tally
        self.classes |= other.classes
        for name, counts in other.seen.items():
            self.seen[name].update(counts)


@dataclass(frozen=True)
class _Fitting:
    """How one batch adds to the :class:`FitSums` (see :func:`fit_features`)."""

    columns: list[FeatureColumn]
    task: Task
    label: str
    has_status: bool
    id_field: str | None
    holdout_percent: int
    index: Index | None

    def add(self, into: FitSums, batch: Mapping[str, Any]) -> None:
        sums, target, tally, seen = into.sums, into.target, into.tally, into.seen
        rows = _fit_rows(batch, self.has_status)
        incomplete = torch.zeros_like(rows)
        training = rows
        if seen and self.index is not None and self.holdout_percent:
            training = rows & ~batch_holdout(batch, self.index, self.holdout_percent)
        elif seen and self.id_field is not None and self.holdout_percent:
            training = rows & ~holdout_mask(batch[self.id_field], self.holdout_percent)
        start = 0
        all_rows = bool(rows.all())
        for i, col in enumerate(self.columns):
            if col.is_category:
                values = category_values(batch, col)
                null = as_bools(values.is_null())
                incomplete |= null
                tally[i] += (null & rows).sum()
                kept = values.filter(pa.array(training.numpy())).drop_null()
                for row in pc.value_counts(kept).to_pylist():
                    seen[col.name][row["values"]] += row["counts"]
                continue
            if all_usable(batch, col):  # no value missing: no masks to build or apply
                # a copy of its own, squared in place; the rows not used weigh 0 in a product
                # with the mask, cheaper than copying out the rows used
                x = batch[col.name].reshape(-1, col.width).to(torch.float64, copy=True)
                used = None if all_rows else rows.to(torch.float64)
                sums[0, start : start + col.width] += x.shape[0] if used is None else used.sum()
                sums[1, start : start + col.width] += x.sum(0) if used is None else used @ x
                x.mul_(x)
                sums[2, start : start + col.width] += x.sum(0) if used is None else used @ x
                start += col.width
                continue
            x, ok = number_values(batch, col)
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
        y, has_y = labels(batch, self.label)
        keep = rows & has_y
        if self.task == "classification":
            if isinstance(y, list):  # string labels: Python values by nature
                into.classes.update(v for v, k in zip(y, keep.tolist(), strict=True) if k)
            else:  # a handful of distinct values per batch, found without a Python loop
                into.classes.update(torch.unique(y[keep]).tolist())
        elif isinstance(y, torch.Tensor):  # a regression label is numeric (check_label)
            yv = y.to(torch.float64)[keep]
            target += torch.stack([keep.sum().to(torch.float64), yv.sum(), (yv * yv).sum()])

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Summary]:
        """One batch's sums as a derive returns them (:data:`FIT_SUMS`)."""
        into = FitSums.empty(self.columns)
        self.add(into, batch)
        return {FIT_SUMS: Summary(into)}


def fitting_sums(
    fields: list[SchemaField],
    *,
    task: Task,
    label: str,
    has_status: bool,
    id_field: str | None = None,
    holdout_percent: int = 0,
    index: Index | None = None,
) -> Derive:
    """A derive (:mod:`pipeline.readers.derive`) that sums each batch where it is read, for a
    :func:`fit_features` over the same loader with the same options: the main process then adds
    the workers' sums instead of receiving and summing every feature value itself. With the
    ``index``, the hold-out is looked up by position: look it up once before the workers fork
    (:func:`~pipeline.training.features.index_holdout`), or each one would."""
    return _Fitting(_columns(fields), task, label, has_status, id_field, holdout_percent, index)


def fit_features(
    batches: Iterable[Mapping[str, Any]],
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
    index: Index | None = None,
) -> FittedFeatures:
    """Fit normalisation, classes and vocabularies in one pass over ``batches`` (this rank's
    share), counting the missing values it meets.

    Normalisation and missing values are taken over the rows used for fitting (accepted ones
    in a result bundle); a string feature's vocabulary over the training split alone (those
    rows but the ones held out by id, ``id_field`` and ``holdout_percent``; with the batches'
    ``index``, looked up by position), so a value only a
    held-out row has is unseen, as it would be in new data. A vocabulary of at most
    ``one_hot_max`` values is one-hot encoded, a larger one embedded; it keeps at most
    ``max_categories`` values (:func:`vocabulary`). A batch summed where it was read (by
    :func:`fitting_sums` with the same options) holds its :data:`FIT_SUMS`, which are added.

    With ``world_size > 1`` the sums, counts, classes and vocabularies are combined across
    ranks (a collective: every rank calls it), so every rank ends with the same spec.
    """
    columns = _columns(fields)
    fitting = _Fitting(columns, task, label, has_status, id_field, holdout_percent, index)
    total = FitSums.empty(columns)
    for batch in batches:
        summed = batch.get(FIT_SUMS)
        if isinstance(summed, Summary):
            total.merge(summed.value)
        else:
            fitting.add(total, batch)
    sums, target, tally = total.sums, total.target, total.tally
    classes, seen = total.classes, total.seen
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
