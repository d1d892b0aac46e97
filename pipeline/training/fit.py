"""Train the reference classifier on one owner's disjoint share; pure torch, no Dagster.

The target is a result column (``lithi_label`` by default) and the features are every numeric
column the manifest declares (see :mod:`pipeline.training.features`). Rows are filtered to
accepted ones and weighted by confidence (both configurable) through masks rather than by
dropping rows, so every DDP rank steps on every batch it has. With ``world_size > 1`` the model is
wrapped in DDP and each epoch runs under ``Join``, because disjoint shards differ in size by one
item and a rank that runs out early must not hang the others.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from pipeline.bundle import format as fmt
from pipeline.readers.batches import accepted_mask, confidence_weights
from pipeline.readers.index import Index
from pipeline.readers.loader import make_loader, set_epoch
from pipeline.readers.reconcile import (
    ReconcileReport,
    Tally,
    reconcile,
    reconcile_distributed,
)
from pipeline.training.features import (
    FeatureSpec,
    class_targets,
    fit_spec,
    holdout_mask,
    to_features,
)
from pipeline.training.model import Classifier


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
    target_column: str = fmt.LABEL_COLUMN
    feature_columns: list[str] | None = None
    holdout_percent: int = Field(default=20, ge=0, lt=100)


@dataclass
class TrainOutcome:
    """What a run produced: weights, the feature spec, metrics, and the reconciliation report."""

    state_dict: dict[str, torch.Tensor]
    spec: FeatureSpec
    loss_curve: list[float]
    metrics: dict[str, float]
    report: ReconcileReport


class TrainSummary(BaseModel):
    """A finished, checkpointed run as plain data: the same for one rank in-process or torchrun."""

    model_config = ConfigDict(frozen=True)

    checkpoint_sha256: str
    loss_curve: list[float]
    metrics: dict[str, float]
    reconciliation: ReconcileReport
    spec: FeatureSpec
    world_size: int

    @classmethod
    def of(cls, outcome: TrainOutcome, checkpoint_sha256: str, world_size: int) -> TrainSummary:
        """Summarise ``outcome`` once its checkpoint is written."""
        return cls(
            checkpoint_sha256=checkpoint_sha256,
            loss_curve=outcome.loss_curve,
            metrics=outcome.metrics,
            reconciliation=outcome.report,
            spec=outcome.spec,
            world_size=world_size,
        )


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
    spec = fit_spec(index, config.target_column, config.feature_columns)
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
                y, has_y = class_targets(batch, spec)
                keep = has_y & ~holdout_mask(ids, config.holdout_percent)
                if config.accepted_only:
                    keep &= accepted_mask(batch)
                w = keep.to(torch.float32)
                if config.weight_by_confidence:
                    w = w * confidence_weights(batch)
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
    metrics = evaluate_model(net, index, spec, config, rank, world_size)
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
def evaluate_model(
    net: nn.Module, index: Index, spec: FeatureSpec, config: TrainConfig, rank: int, world_size: int
) -> dict[str, float]:
    """Accuracy against the Compute labels on held-out and training accepted rows."""
    net.eval()
    loader = _loader(
        index, config.model_copy(update={"num_workers": 0}), rank, world_size, shuffle=False
    )
    hits = [0.0, 0.0, 0.0, 0.0]  # holdout correct, holdout n, train correct, train n
    module = net.module if hasattr(net, "module") else net
    for batch in loader:
        y, has_y = class_targets(batch, spec)
        ok = has_y & accepted_mask(batch)
        hold = holdout_mask(batch[index.id_field], config.holdout_percent)
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
