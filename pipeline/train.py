"""Train a classifier on a verified snapshot through the disjoint readers; pure torch, no Dagster.

The target is a result column (``lithi_label`` by default), the features are every numeric column
the manifest declares (scalars and fixed-size lists) other than the id, the ``lithi_*`` columns
and the target, so a second data set with other columns trains with no code change. Rows are
filtered to accepted ones and weighted by confidence (both configurable). With ``world_size > 1``
the model is wrapped in DDP and each epoch runs under ``Join``, because disjoint shards differ in
size by one item and a rank that runs out early must not hang the others.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.utils.data import DataLoader

from pipeline import format as fmt
from pipeline.datasets import MapDataset, OwnerSampler, collate_batches
from pipeline.digest import sha256_bytes, sha256_file
from pipeline.fsutil import atomic_write_bytes
from pipeline.index import Index
from pipeline.loader import make_loader, set_epoch
from pipeline.manifest import Schema
from pipeline.reconcile import ReconcileReport, Tally, reconcile, reconcile_distributed

_NUMERIC = "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64".split()
EXCLUDED_BY_DEFAULT = ("label",)  # a ground-truth column is never a feature


class TrainConfig(BaseModel):
    """Hyperparameters and data choices of one training run; recorded beside the checkpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epochs: int = Field(default=12, ge=1)
    batch_size: int = Field(default=64, ge=1)
    learning_rate: float = Field(default=3e-3, gt=0)
    hidden: int = Field(default=128, ge=1)
    seed: int = 0
    num_workers: int = Field(default=2, ge=0)
    reader: Literal["map", "iterable"] = "map"
    accepted_only: bool = True
    weight_by_confidence: bool = True
    target_column: str = fmt.LITHI_PREFIX + "label"
    feature_columns: list[str] | None = None
    holdout_percent: int = Field(default=20, ge=0, lt=100)


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


def fit_spec(index: Index, config: TrainConfig) -> FeatureSpec:
    """Choose features from the manifest and fit their normalisation on the accepted rows."""
    schema = index.schema
    cols = config.feature_columns or feature_columns(schema, index.id_field, config.target_column)
    if not cols:
        raise ValueError(f"no numeric feature columns in {schema.names}")
    for name in [*cols, config.target_column]:
        schema.field(name)  # KeyError naming the declared columns
    read = [*cols, config.target_column, fmt.STATUS_COLUMN]
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
    target = table.column(config.target_column).drop_null()
    classes = sorted(int(v) for v in pc.unique(target).to_pylist())
    if len(classes) < 2:
        raise ValueError(f"need at least two classes in {config.target_column!r}, found {classes}")
    return FeatureSpec(
        columns=cols,
        widths=[m.shape[1] for m in mats],
        mean=mean.tolist(),
        std=std.tolist(),
        classes=classes,
        target_column=config.target_column,
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


def holdout_mask(ids: list[str], percent: int) -> torch.Tensor:
    """Which items are held out: a pure function of the id's sha256, never of a seed or a hash()."""
    if percent == 0:
        return torch.zeros(len(ids), dtype=torch.bool)
    return torch.tensor(
        [int(sha256_bytes(i.encode())[:8], 16) % 100 < percent for i in ids], dtype=torch.bool
    )


def _targets(batch: dict, spec: FeatureSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Class indices of the target and a mask of rows that have a known class."""
    raw = batch[spec.target_column]
    raw = raw.to(torch.int64) if isinstance(raw, torch.Tensor) else torch.tensor(raw)
    valid = batch.get(f"{spec.target_column}__valid")
    valid = valid if valid is not None else torch.ones_like(raw, dtype=torch.bool)
    classes = torch.tensor(spec.classes, dtype=torch.int64)
    idx = torch.searchsorted(classes, raw).clamp(max=len(classes) - 1)
    return idx, valid & (classes[idx] == raw)


class Classifier(nn.Module):
    """A small MLP: enough to learn the Compute labels, small enough to train in seconds."""

    def __init__(self, dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for each class."""
        return self.net(x)


@dataclass
class TrainOutcome:
    """What a run produced: weights, the feature spec, metrics, and the reconciliation report."""

    state_dict: dict[str, torch.Tensor]
    spec: FeatureSpec
    loss_curve: list[float]
    metrics: dict[str, float]
    report: ReconcileReport
    extra: dict = field(default_factory=dict)


def _loader(index: Index, config: TrainConfig, rank: int, world_size: int, shuffle: bool):
    return make_loader(
        index,
        style=config.reader,
        batch_size=config.batch_size,
        num_workers=config.num_workers,
        shuffle=shuffle,
        seed=config.seed,
        rank=rank,
        world_size=world_size,
    )


def _all_sum(values: list[float], world_size: int) -> list[float]:
    if world_size == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def fit(
    index: Index,
    config: TrainConfig,
    *,
    rank: int = 0,
    world_size: int = 1,
    log: Callable[[str], None] = print,
) -> TrainOutcome:
    """Train on this rank's disjoint share; collective calls assume ``dist`` is initialised."""
    torch.manual_seed(config.seed)
    spec = fit_spec(index, config)
    model = Classifier(spec.dim, config.hidden, len(spec.classes))
    net: nn.Module = model
    if world_size > 1:
        net = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(net.parameters(), lr=config.learning_rate)
    loader = _loader(index, config, rank, world_size, shuffle=True)
    curve: list[float] = []
    report: ReconcileReport | None = None
    for epoch in range(config.epochs):
        set_epoch(loader, epoch)
        tally = Tally(index.id_field, label=f"rank {rank}")
        loss_sum, weight_sum = 0.0, 0.0
        join = (
            torch.distributed.algorithms.Join([net]) if world_size > 1 else contextlib.nullcontext()
        )
        with join:
            for batch in loader:
                tally.update(batch)
                ids = batch[index.id_field]
                y, has_y = _targets(batch, spec)
                keep = has_y & ~holdout_mask(ids, config.holdout_percent)
                if config.accepted_only:
                    keep &= torch.tensor([s == "accepted" for s in batch[fmt.STATUS_COLUMN]])
                w = torch.ones(len(ids))
                if config.weight_by_confidence:
                    conf = batch[fmt.CONFIDENCE_COLUMN].to(torch.float32)
                    w = torch.nan_to_num(conf, nan=0.0)
                w = w * keep
                logits = net(to_features(batch, spec))
                per_row = nn.functional.cross_entropy(logits, y, reduction="none")
                # Every rank steps on every batch it has, even one with no kept row, so DDP's
                # gradient all-reduce always has all non-joined ranks.
                loss = (per_row * w).sum() / w.sum().clamp(min=1e-8)
                opt.zero_grad()
                loss.backward()
                opt.step()
                loss_sum += float((per_row * w).sum().detach())
                weight_sum += float(w.sum())
        total_loss, total_w = _all_sum([loss_sum, weight_sum], world_size)
        curve.append(total_loss / max(total_w, 1e-8))
        if world_size > 1:
            report = reconcile_distributed(index.manifest, tally.counts, ids=index.ids)
        else:
            report = reconcile(index.manifest, [tally.counts], ids=index.ids)
        if rank == 0:
            log(
                f"epoch {epoch + 1}/{config.epochs}: loss {curve[-1]:.4f}, "
                f"{report.items_iterated} items iterated"
            )
    metrics = evaluate(net, index, spec, config, rank, world_size)
    if rank == 0:
        log(
            f"held-out accuracy {metrics['holdout_accuracy']:.4f} "
            f"over {int(metrics['holdout_items'])} accepted items"
        )
    assert report is not None
    return TrainOutcome(
        state_dict={k: v.detach().clone() for k, v in model.state_dict().items()},
        spec=spec,
        loss_curve=curve,
        metrics=metrics,
        report=report,
    )


@torch.no_grad()
def evaluate(
    net: nn.Module, index: Index, spec: FeatureSpec, config: TrainConfig, rank: int, world_size: int
) -> dict[str, float]:
    """Accuracy against the Compute labels on held-out and training accepted rows."""
    net.eval()
    loader = _loader(
        index, config.model_copy(update={"num_workers": 0}), rank, world_size, shuffle=False
    )
    hits = [0.0, 0.0, 0.0, 0.0]  # holdout correct, holdout n, train correct, train n
    for batch in loader:
        y, has_y = _targets(batch, spec)
        ok = has_y & torch.tensor([s == "accepted" for s in batch[fmt.STATUS_COLUMN]])
        hold = holdout_mask(batch[index.id_field], config.holdout_percent)
        module = net.module if hasattr(net, "module") else net
        pred = module(to_features(batch, spec)).argmax(dim=1)
        correct = (pred == y) & ok
        hits[0] += float((correct & hold).sum())
        hits[1] += float((ok & hold).sum())
        hits[2] += float((correct & ~hold).sum())
        hits[3] += float((ok & ~hold).sum())
    hits = _all_sum(hits, world_size)
    net.train()
    return {
        "holdout_accuracy": hits[0] / hits[1] if hits[1] else math.nan,
        "holdout_items": hits[1],
        "train_accuracy": hits[2] / hits[3] if hits[3] else math.nan,
        "train_items": hits[3],
    }


def outcome_summary(outcome: TrainOutcome, checkpoint_sha256: str, world_size: int) -> dict:
    """Plain data about a finished, checkpointed run, the same whether one rank or many trained."""
    return {
        "checkpoint_sha256": checkpoint_sha256,
        "loss_curve": outcome.loss_curve,
        "metrics": outcome.metrics,
        "report": outcome.report.as_dict(),
        "spec": outcome.spec.model_dump(),
        "world_size": world_size,
    }


def save_checkpoint(outcome: TrainOutcome, config: TrainConfig, path: str | os.PathLike) -> str:
    """Write the weights, feature spec and config atomically; return the file's sha256."""
    import io

    buf = io.BytesIO()
    torch.save(
        {
            "state_dict": outcome.state_dict,
            "spec": outcome.spec.model_dump(),
            "config": config.model_dump(),
            "hidden": config.hidden,
        },
        buf,
    )
    atomic_write_bytes(path, buf.getvalue(), replace=False)
    return sha256_file(path)


def load_checkpoint(path: str | os.PathLike) -> tuple[Classifier, FeatureSpec]:
    """Load a checkpoint with ``weights_only=True``: tensors and plain data, never pickled code."""
    ckpt = torch.load(Path(path), weights_only=True)
    spec = FeatureSpec.model_validate(ckpt["spec"])
    model = Classifier(spec.dim, int(ckpt["hidden"]), len(spec.classes))
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    return model, spec


PREDICTION_COLUMNS = ("prediction", "score", "checkpoint_sha256")


@torch.no_grad()
def predict(index: Index, checkpoint: str | os.PathLike, *, batch_size: int = 1024) -> pa.Table:
    """One row per index item, failed and abstained too, keyed by the same string id."""
    model, spec = load_checkpoint(checkpoint)
    digest = sha256_file(checkpoint)
    ds = MapDataset(index)
    sampler = OwnerSampler(index, rank=0, world_size=1, shuffle=False, seed=0)
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=collate_batches)
    ids: list[str] = []
    preds: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    statuses: list[str] = []
    classes = torch.tensor(spec.classes)
    for batch in loader:
        prob = torch.softmax(model(to_features(batch, spec)), dim=1)
        score, k = prob.max(dim=1)
        ids += batch[index.id_field]
        statuses += batch[fmt.STATUS_COLUMN]
        preds.append(classes[k].numpy())
        scores.append(score.numpy().astype(np.float32))
    n = len(ids)
    return pa.table(
        {
            index.id_field: pa.array(ids, pa.string()),
            "prediction": pa.array(np.concatenate(preds) if preds else [], pa.int64()),
            "score": pa.array(np.concatenate(scores) if scores else [], pa.float32()),
            fmt.STATUS_COLUMN: pa.array(statuses, pa.string()),
            "checkpoint_sha256": pa.array([digest] * n, pa.string()),
        }
    )
