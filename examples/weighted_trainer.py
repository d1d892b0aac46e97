"""A trainer of your own: a small PyTorch model, each row weighted by ``lithi_confidence``.

Select it with ``LITHI_TRAINER=examples.weighted_trainer:WeightedTrainer``. It reads only through
``ctx.loader`` (a ``MapDataset`` over this rank's disjoint share of the verified index), so the
pipeline can reconcile what it iterated; it writes its checkpoint into ``ctx.output_dir`` and
predicts one row per item keyed by the id. Everything else — verification, the record, hashing
the checkpoint, staging the predictions — is the pipeline's job.

On a GPU machine it trains there with no change: the model goes to ``ctx.device``, each batch
through ``ctx.to_device`` (pinned batches, copied without blocking; ids stay strings), and the
checkpoint is saved from CPU tensors (``cpu_state_dict``) so its digest does not name the GPU.
"""

from __future__ import annotations

import json
from contextlib import nullcontext

import pyarrow as pa
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from pipeline.readers import confidence_weights
from pipeline.training import (
    FeatureSet,
    FitContext,
    FitResult,
    PredictContext,
    Trainer,
    cpu_state_dict,
)


class WeightedConfig(BaseModel):
    """What to predict from what: a 0/1 label column and numeric scalar feature columns."""

    model_config = ConfigDict(extra="forbid")

    label: str
    features: list[str] = Field(min_length=1)
    epochs: int = Field(default=20, ge=1)
    learning_rate: float = Field(default=0.05, gt=0)


def _inputs(batch: dict, features: list[str], mean: torch.Tensor, std: torch.Tensor):
    x = torch.stack([batch[f].to(torch.float32) for f in features], dim=1)
    return torch.nan_to_num((x - mean) / std)


class WeightedTrainer(Trainer):
    """Logistic regression on the named features, rows weighted by their Compute confidence."""

    Config = WeightedConfig
    version = "1.0"

    def fit(self, ctx: FitContext) -> FitResult:
        """Standardise, then fit by full-batch-free SGD over this rank's batches."""
        cfg: WeightedConfig = ctx.config
        loader = ctx.loader(style="map", batch_size=128, shuffle=True)
        # One pass for the feature means and standard deviations (summed across ranks).
        s = torch.zeros(3, len(cfg.features), dtype=torch.float64)
        for batch in loader:  # on the host: a CPU tensor for gloo's all_reduce
            x = torch.stack([batch[f].to(torch.float64) for f in cfg.features], dim=1)
            s += torch.stack([torch.ones_like(x).sum(0), x.sum(0), (x * x).sum(0)])
        if ctx.world_size > 1:
            torch.distributed.all_reduce(s)
        mean = (s[1] / s[0]).float()
        std = ((s[2] / s[0]) - (s[1] / s[0]) ** 2).clamp(min=1e-12).sqrt().float()
        torch.manual_seed(0)
        model = nn.Linear(len(cfg.features), 1).to(ctx.device)  # initialised on the CPU
        mean, std = mean.to(ctx.device), std.to(ctx.device)
        if ctx.world_size > 1:
            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.learning_rate)
        curve = []
        for epoch in range(cfg.epochs):
            loader.set_epoch(epoch)
            sums = torch.zeros(2, dtype=torch.float64, device=ctx.device)
            join = (
                torch.distributed.algorithms.Join([model]) if ctx.world_size > 1 else nullcontext()
            )
            with join:
                for batch in loader:
                    batch = ctx.to_device(batch)
                    y = batch[cfg.label].to(torch.float32)
                    w = confidence_weights(batch)  # 0 where a row failed (no confidence)
                    logit = model(_inputs(batch, cfg.features, mean, std)).squeeze(1)
                    loss_rows = nn.functional.binary_cross_entropy_with_logits(
                        logit, y, reduction="none"
                    )
                    loss = (loss_rows * w).sum() / w.sum().clamp(min=1e-6)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    # summed on the device: no step waits for the GPU to report a number
                    sums += torch.stack([(loss_rows * w).sum(), w.sum()]).detach().double()
            total, weight = sums.tolist()
            curve.append(total / max(weight, 1e-6))
        if ctx.rank == 0:
            net = model.module if hasattr(model, "module") else model
            torch.save(cpu_state_dict(net), ctx.output_dir / "model.pt")
            stats = {"mean": mean.tolist(), "std": std.tolist()}
            (ctx.output_dir / "scaling.json").write_text(json.dumps(stats))
        return FitResult(
            metrics={"final_weighted_loss": curve[-1]},
            loss_curve=curve,
            features=FeatureSet(used=cfg.features),
        )

    @torch.no_grad()
    def predict(self, ctx: PredictContext) -> pa.Table:
        """The probability of label 1 and the 0/1 decision for every item."""
        cfg: WeightedConfig = ctx.config
        model = nn.Linear(len(cfg.features), 1)
        model.load_state_dict(torch.load(ctx.checkpoint_dir / "model.pt", weights_only=True))
        model.to(ctx.device)
        stats = json.loads((ctx.checkpoint_dir / "scaling.json").read_text())
        mean = torch.tensor(stats["mean"], device=ctx.device)
        std = torch.tensor(stats["std"], device=ctx.device)
        ids, probs = [], []
        for batch in ctx.loader(style="map", batch_size=512, shuffle=False, num_workers=0):
            ids += batch[ctx.index.id_field]  # strings, on the host
            x = _inputs(ctx.to_device(batch), cfg.features, mean, std)
            probs.append(torch.sigmoid(model(x).squeeze(1)).cpu())
        p = torch.cat(probs) if probs else torch.zeros(0)
        return pa.table(
            {
                ctx.index.id_field: pa.array(ids, pa.string()),
                "probability": pa.array(p.numpy(), pa.float32()),
                "prediction": pa.array((p >= 0.5).to(torch.int64).numpy(), pa.int64()),
            }
        )
