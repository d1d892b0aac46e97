"""The reference trainer's loop: fit a small MLP on one owner's disjoint share; pure torch.

It reads only through the loaders the pipeline hands it (``ctx.loader``), so every pass is
tallied and reconciled by the pipeline, not here. Rows it does not learn from — held out, not
accepted, without a label — weigh 0 rather than leave the pass, so every DDP rank steps on every
batch it has (on the CPU a step computes only the rows that weigh something); with
``world_size > 1`` the model is wrapped in DDP, and where the ranks' shares differ in batches
the steps beyond the shortest share run under ``Join``: disjoint shares may differ in size, and
a rank that runs out early must not hang the others.

On a GPU (``ctx.device``) the model, the normalisation and the loss run there: batches arrive
pinned and are copied without blocking, and running sums stay on the device so no step waits
for the GPU to report a number. The model is built on the CPU from the seed and then moved, and
the checkpoint is saved from CPU tensors, so the same fit writes the same bytes on any device
whose kernels agree. The feature normalisation is fitted in float64 on the CPU, the same on
every device.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeline.readers.batches import accepted_mask, confidence_weights
from pipeline.readers.derive import Derive
from pipeline.readers.index import Index
from pipeline.training.columns import Task
from pipeline.training.denormals import flushed_denormals
from pipeline.training.device import cpu_state_dict, tensor_to, to_device
from pipeline.training.feature_fit import FittedFeatures, fit_features, fitting_sums
from pipeline.training.features import (
    FeatureSpec,
    batch_holdout,
    class_targets,
    incomplete_rows,
    index_holdout,
    regression_targets,
    to_features,
)
from pipeline.training.host_allreduce import attach_host_allreduce
from pipeline.training.model import model_for, save_checkpoint, scores
from pipeline.training.reference_config import ReferenceConfig, check_config, checkpoint_config
from pipeline.training.trainer import (
    FitContext,
    FitResult,
    TalliedLoader,
    TrainerError,
    merge_tallied_states,
)

CHECKPOINT = "model.pt"

#: Devices whose Adam step runs fused, one kernel per parameter: torch's default on the CPU is a
#: loop of small operations per parameter, a sizeable share of a small model's step
#: (docs/performance.md). The arithmetic is Adam's either way; its rounding may differ.
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def _all_sum(values: list[float], world_size: int) -> list[float]:
    if world_size == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def _all_min_max(value: int, world_size: int) -> tuple[int, int]:
    """The least and the greatest ``value`` across ranks, in one all-reduce."""
    if world_size == 1:
        return value, value
    t = torch.tensor([value, -value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t[0]), -int(t[1])


def _targets(batch: dict, spec: FeatureSpec) -> tuple[torch.Tensor, torch.Tensor]:
    if spec.task == "classification":
        return class_targets(batch, spec)
    return regression_targets(batch, spec)


#: What :func:`fit_tensors` derives from each batch: the model's inputs and targets, each row's
#: training weight (0: not trained on), whether it is scored, and whether it is held out.
X, Y, WEIGHT, SCORED, HELD_OUT = "__x", "__y", "__weight", "__scored", "__held_out"


def fit_tensors(
    batch: Mapping[str, Any],
    *,
    spec: FeatureSpec,
    config: ReferenceConfig,
    index: Index,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Everything the training steps and the evaluation take from a batch, on ``device``.

    The fit has the readers derive these where the batch is read (``ctx.loader``'s
    ``set_derive``): in the DataLoader workers, so the main process only steps. Without workers
    the fit computes them itself, on its device. Masks made from strings (statuses, string
    labels) and the hold-out (looked up by the rows' index positions) are built on the host and
    copied; the numeric columns are copied first and computed on the device.
    """
    has_status = index.is_result
    held_out = tensor_to(batch_holdout(batch, index, config.holdout_percent), device)
    batch = to_device(batch, device)
    y, has_y = _targets(batch, spec)
    scored = tensor_to(has_y, device)
    if config.missing != "fill":  # a row it would not train on is not scored either
        scored = scored & ~incomplete_rows(batch, spec, device=device)
    accepted = tensor_to(accepted_mask(batch), device) if has_status else None
    keep = scored & ~held_out
    if config.accepted_only and accepted is not None:
        keep &= accepted
    if accepted is not None:  # only accepted rows are scored, whatever the fit trained on
        scored = scored & accepted
    w = keep.to(torch.float32)
    if config.weight_by_confidence and has_status:
        w = w * confidence_weights(batch)
    return {
        X: to_features(batch, spec, device=device),
        Y: tensor_to(y, device),
        WEIGHT: w,
        SCORED: scored,
        HELD_OUT: held_out,
    }


def batch_tensors(
    batch: Mapping[str, Any],
    spec: FeatureSpec,
    config: ReferenceConfig,
    index: Index,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """The batch's :func:`fit_tensors`: as the readers derived them, else computed here."""
    if X in batch:
        return {k: tensor_to(batch[k], device) for k in (X, Y, WEIGHT, SCORED, HELD_OUT)}
    return fit_tensors(batch, spec=spec, config=config, index=index, device=device)


def training_rows(
    batch: Mapping[str, Any],
    spec: FeatureSpec,
    config: ReferenceConfig,
    index: Index,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inputs, targets and weights of the rows a training step learns from, on ``device``.

    On the CPU only the rows of weight other than 0 are kept: a held-out row, one not accepted
    or without a label weighs 0, so its forward and backward would change nothing but take as
    long as a trained row's. The loss and its gradients are the same sums without them. On a
    GPU every row goes: choosing rows there would make the host wait for the device on every
    step, and copying the chosen ones would give up the pinned batch's asynchronous copy.
    """
    t = batch_tensors(batch, spec, config, index, device)
    x, y, w = t[X], t[Y], t[WEIGHT]
    if device.type != "cpu":
        return x, y, w
    kept = w != 0
    if bool(kept.all()):
        return x, y, w
    rows = kept.nonzero().squeeze(1)
    return x.index_select(0, rows), y.index_select(0, rows), w.index_select(0, rows)


def _joined(
    ddp: nn.parallel.DistributedDataParallel | None, *, uneven: bool
) -> contextlib.AbstractContextManager:
    """``Join`` over ``ddp`` where the ranks' shares may differ in batches, so a rank that runs
    out shadows the others' all-reduces instead of leaving them waiting. Where every rank has
    the same number of batches nothing is left to shadow, and Join would cost an all-reduce of
    its own on every step (docs/performance.md): there it is entered disabled, since a Join
    leaves its setting on DDP after it exits and an earlier one would still be on."""
    if ddp is None:
        return contextlib.nullcontext()
    return torch.distributed.algorithms.Join([ddp], enable=uneven)


def row_loss(out: torch.Tensor, y: torch.Tensor, task: Task) -> torch.Tensor:
    """Each row's loss (cross-entropy, or squared error on the standardised target)."""
    if task == "classification":
        return nn.functional.cross_entropy(out, y, reduction="none")
    return nn.functional.mse_loss(out.squeeze(1), y, reduction="none")


def train_step(
    net: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    w: torch.Tensor,
    sums: torch.Tensor,
    config: ReferenceConfig,
) -> None:
    """One optimizer step on a batch's rows weighted by ``w``; ``sums`` (on the device) gains
    the weighted loss and the weight, so nothing here makes the host wait for the GPU.

    Every rank steps on every batch it has, even one with no kept row, so DDP's gradient
    all-reduce always has all non-joined ranks.
    """
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=config.amp):
        per_row = row_loss(net(x), y, config.task).float()
    loss = (per_row * w).sum() / w.sum().clamp(min=1e-8)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sums[0] += (per_row * w).sum().detach().double()
    sums[1] += w.sum().double()


def fit_reference(ctx: FitContext) -> FitResult:
    """Choose features, fit their normalisation, train, evaluate, and write the checkpoint.

    With ``flush_denormals`` (the default) the CPU treats float32 values below the normal range
    as zero meanwhile (:mod:`pipeline.training.denormals`).
    """
    config: ReferenceConfig = ctx.config
    with flushed_denormals(config.flush_denormals):
        return _fit_reference(ctx, config)


def _fit_reference(ctx: FitContext, config: ReferenceConfig) -> FitResult:
    index = ctx.index
    fields, feature_set = check_config(config, index.schema, index.id_field)
    if config.auto_features:
        ctx.log(f"auto_features chose {feature_set.used}; left out {feature_set.dropped}")
    has_status = index.is_result
    torch.manual_seed(config.seed)
    # Only what the fit uses is read (the id and lithi_* columns come too): less to decode,
    # and a column no model takes (a list of strings, say) is never read at all.
    columns = [config.label, *feature_set.used]
    loader = ctx.loader(
        style=config.reader,
        batch_size=config.batch_size,
        shuffle=True,
        mix=config.mix,
        seed=config.seed,
        columns=columns,
    )
    resumed = ctx.progress.load()
    has_workers = loader.loader.num_workers > 0
    if has_workers:  # looked up here once, so every worker forked from now on inherits it
        index_holdout(index, config.holdout_percent)
    if resumed is None:
        options: dict[str, Any] = {
            "task": config.task,
            "label": config.label,
            "has_status": has_status,
            "id_field": index.id_field,
            "holdout_percent": config.holdout_percent,
            "index": index,
        }
        fitting = _fitting_pass(ctx, loader, config, columns, fitting_sums(fields, **options))
        fitted = fit_features(
            fitting,
            fields,
            world_size=ctx.world_size,
            one_hot_max=config.one_hot_max,
            max_categories=config.max_categories,
            **options,
        )
        if fitting is not loader:  # its workers are gone before the fit's fork
            fitting.stop_workers()
        loader.set_batch_size(config.batch_size)  # the epochs step on the batches asked for
        _refuse_missing(fitted, config)
        if ctx.rank == 0:
            _log_fitted(ctx, fitted, config)
    else:
        fitted = FittedFeatures(
            spec=FeatureSpec.model_validate(resumed.shared["spec"]),
            **resumed.shared.get("fitted", {"missing": {}, "incomplete_rows": 0, "rows": 0}),
        )
    spec = fitted.spec
    feature_set = feature_set.model_copy(update=_missing_record(fitted, config))
    device = ctx.device
    if has_workers:  # the workers compute each batch's tensors while this process steps
        loader.set_derive(functools.partial(fit_tensors, spec=spec, config=config, index=index))
    model = model_for(spec, config.hidden).to(device)  # initialised on the CPU
    opt = torch.optim.Adam(
        model.parameters(), lr=config.learning_rate, fused=device.type in FUSED_ADAM_DEVICES
    )
    curve: list[float] = []
    first_epoch, step, done = 0, 0, 0
    # loss x weight and weight summed this epoch, on the device: read once per epoch (or cut)
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    if resumed is not None:
        shared = resumed.shared
        model.load_state_dict(shared["model"])
        opt.load_state_dict(shared["optimizer"])
        torch.set_rng_state(shared["rng"])
        curve = [float(v) for v in shared["loss_curve"]]
        first_epoch, step, done = int(shared["epoch"]), resumed.step, int(shared["done"])
        if resumed.local is not None:  # the same shape: this rank's own place
            saved = resumed.local["sums"]
            loader.load_state_dict(resumed.local["loader"])
        else:  # another shape: the rest of the epoch re-split, rank 0 holding what was summed
            saved = [sum(float(p["sums"][i]) for p in resumed.locals) for i in (0, 1)]
            saved = saved if ctx.rank == 0 else [0.0, 0.0]
            states = [p["loader"] for p in resumed.locals]
            loader.load_state_dict(merge_tallied_states(states, rank=ctx.rank))
            done = 0  # batches of this leg of the epoch
        sums = torch.tensor([float(v) for v in saved], dtype=torch.float64, device=device)
        if ctx.rank == 0:
            ctx.log(
                f"resumed after step {step} (cut on {resumed.world_size} rank(s), resumed on "
                f"{ctx.world_size}): epoch {first_epoch + 1}/{config.epochs}, "
                f"{len(loader) - done} of this rank's batches left"
            )
    net: nn.Module = model
    ddp: nn.parallel.DistributedDataParallel | None = None
    if ctx.world_size > 1:
        ids = [device.index] if device.type == "cuda" else None
        net = ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if device.type == "cpu" and config.host_allreduce:
            # the segment lives as long as the hook DDP holds: it is unmapped with DDP
            _, said = attach_host_allreduce(ddp, model)
            if ctx.rank == 0:
                ctx.log(said)

    def save_cut(step: int, epoch: int, done: int) -> None:
        """A mid-fit cut after ``step``: what every rank shares, and this rank's own place."""
        ctx.progress.save(
            step,
            shared={
                "spec": spec.model_dump(),
                "fitted": {
                    "missing": fitted.missing,
                    "incomplete_rows": fitted.incomplete_rows,
                    "rows": fitted.rows,
                },
                "model": cpu_state_dict(model),
                "optimizer": opt.state_dict(),
                "rng": torch.get_rng_state(),
                "loss_curve": curve,
                "epoch": epoch,
                "done": done,
            },
            local={"loader": loader.state_dict(), "sums": sums.tolist()},
        )

    for epoch in range(first_epoch, config.epochs):
        resuming = resumed is not None and epoch == first_epoch
        if not resuming:
            loader.set_epoch(epoch + 1)  # epoch 0 was the fitting pass
            done = 0
            sums.zero_()
        # batches every rank steps on this leg, and the most any rank has
        common, most = _all_min_max(len(loader), ctx.world_size)
        # ``step`` counts the steps every rank has taken, so the ranks agree on when a cut is
        # due and name it alike even when their shares differ in batches (Join evens them out)
        base = step - done
        # Every rank has its first ``common`` batches, so those run in plain DDP; only the
        # rest, where the shares differ, runs under Join (which all-reduces on every step of
        # its own), and a rank with nothing left joins at once. A resumed leg's len() may
        # count its whole epoch rather than what each rank has left: those counts cannot show
        # the ranks even, so all of it runs under Join.
        batches = iter(loader)
        plain = 0 if resuming else common
        for part, uneven in (
            (itertools.islice(batches, plain), False),
            (batches, common != most or resuming),
        ):
            with _joined(ddp, uneven=uneven):
                for batch in part:
                    x, y, w = training_rows(batch, spec, config, index, device)
                    train_step(net, opt, x, y, w, sums, config)
                    done += 1
                    if done > common:  # this rank steps on alone (the others joined): no cut
                        continue
                    step = base + done
                    if ctx.progress.due(step):
                        save_cut(step, epoch, done)
        total_loss, total_w = _all_sum(sums.tolist(), ctx.world_size)
        curve.append(total_loss / max(total_w, 1e-8))
        if ctx.rank == 0:
            ctx.log(f"epoch {epoch + 1}/{config.epochs}: loss {curve[-1]:.4f}")
    metrics = evaluate_model(model, ctx, spec, config, fit_loader=loader)
    if ctx.rank == 0:
        ctx.log(", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        save_checkpoint(
            ctx.output_dir / CHECKPOINT,
            state_dict=cpu_state_dict(model),
            spec=spec,
            config=checkpoint_config(config),
            hidden=config.hidden,
        )
    return FitResult(metrics=metrics, loss_curve=curve, features=feature_set)


def _refuse_missing(fitted: FittedFeatures, config: ReferenceConfig) -> None:
    """With ``missing: refuse``, stop before training if any feature misses a value."""
    if config.missing != "refuse":
        return
    found = [(name, n) for name, n in fitted.missing.items() if n]
    if found:
        (name, n), rest = found[0], found[1:]
        others = "".join(f", {other!r} has {m}" for other, m in rest)
        raise TrainerError(
            f"feature {name!r} has {n} missing value(s){others} (null or NaN, among the "
            f"{fitted.rows} rows used for fitting) and missing is 'refuse'; fill them in the "
            "table, or set missing to 'fill' or 'drop'"
        )


def _missing_record(fitted: FittedFeatures, config: ReferenceConfig) -> dict:
    """What the record says of missing values: the rule, and what it did."""
    if config.missing == "fill":
        return {"missing": "fill", "filled": dict(fitted.missing)}
    if config.missing == "drop":
        return {"missing": "drop", "rows_dropped": fitted.incomplete_rows}
    return {"missing": "refuse"}


def _log_fitted(ctx: FitContext, fitted: FittedFeatures, config: ReferenceConfig) -> None:
    for col in fitted.spec.columns:
        if col.is_category:
            beyond = fitted.left_out.get(col.name, 0)
            more = f" ({beyond} rarer ones left out: unseen)" if beyond else ""
            ctx.log(f"{col.name}: {len(col.vocabulary)} values, {col.encoding}{more}")
    missing = {k: v for k, v in fitted.missing.items() if v}
    if missing:
        what = {"fill": "filled", "drop": "rows dropped", "refuse": "refused"}[config.missing]
        ctx.log(
            f"missing values among the {fitted.rows} rows used for fitting ({what}): {missing}"
            + (f"; {fitted.incomplete_rows} rows dropped" if config.missing == "drop" else "")
        )


#: Rows per batch at the least of a pass read in this process that needs no particular batch
#: (the fitting pass, the evaluation): its per-batch work (masks, targets, the tally) is paid
#: less often, while the model's forward is sliced anyway (``scores``).
WHOLE_PASS_ROWS = 4096


def whole_pass(
    ctx: FitContext,
    fit_loader: TalliedLoader,
    config: ReferenceConfig,
    columns: list[str],
    *,
    epoch: int,
) -> TalliedLoader:
    """The loader of a pass that needs no particular batch: the fitting pass (``epoch`` 0)
    or, where the workers do not score (:func:`_evaluation_pass`), the evaluation (one epoch
    past the last).

    With worker processes, it is the fit's own loader at ``epoch``, cut in whole worker
    messages (set the batch size back before stepping on it), so no other worker is forked:
    workers forked for a second loader while the fit's persistent workers still had their queue
    threads could inherit a held lock and never start, leaving a rank hung while the others
    wait for it in an all-reduce. Without workers it is a loader of its own reading ``columns``
    in this process, in batches of :data:`WHOLE_PASS_ROWS` or more.
    """
    if fit_loader.loader.num_workers > 0:
        fit_loader.set_epoch(epoch)
        fit_loader.set_batch_size(max(config.batch_size, fit_loader.loader.message_rows))
        return fit_loader
    return ctx.loader(
        style=config.reader,
        batch_size=max(config.batch_size, WHOLE_PASS_ROWS),
        shuffle=False,
        num_workers=0,
        columns=columns,
    )


def _fitting_pass(
    ctx: FitContext,
    fit_loader: TalliedLoader,
    config: ReferenceConfig,
    columns: list[str],
    summing: Derive,
) -> TalliedLoader:
    """The fitting pass's loader, its workers summing what they read (``summing``) where there
    are two or more of them: one worker that reads and sums alone is slower than one that
    reads while this process sums (docs/performance.md).

    On the CPU in a fit of one rank, a loader of its own with a worker per core the fit holds
    (its workers' and the model's intra-op threads'): no model runs yet, and this process only
    adds their sums. Stop its workers once the pass is over, before the fit's fork. Elsewhere the
    pass :func:`whole_pass` gives (a rank of several keeps to the fit's own loader, see
    :func:`_evaluation_pass`).
    """
    workers = fit_loader.loader.num_workers
    if ctx.device.type == "cpu" and workers and ctx.world_size == 1:
        return _every_core_pass(ctx, workers, config, columns, summing)
    loader = whole_pass(ctx, fit_loader, config, columns, epoch=0)
    if workers >= 2:  # whole messages, as whole_pass cuts them with workers
        loader.set_derive(summing)
    return loader


#: What :func:`scored_tensors` adds to a batch's targets and masks: the trained model's answer
#: for each row, the class it picks (classification) or its error in the label's units.
ANSWER = "__answer"


def scored_tensors(
    batch: Mapping[str, Any],
    *,
    model: nn.Module,
    spec: FeatureSpec,
    config: ReferenceConfig,
    index: Index,
) -> dict[str, torch.Tensor]:
    """A batch's targets and masks (:func:`fit_tensors`) and the trained model's answer for
    each row: all the evaluation sums, and no features. The evaluation has the readers derive
    these where the batch is read, so every DataLoader worker scores the batches it reads."""
    t = fit_tensors(batch, spec=spec, config=config, index=index)
    answer = _answer(model, t[X], t[Y], spec)
    return {Y: t[Y], SCORED: t[SCORED], HELD_OUT: t[HELD_OUT], ANSWER: answer}


@torch.no_grad()
def _answer(model: nn.Module, x: torch.Tensor, y: torch.Tensor, spec: FeatureSpec) -> torch.Tensor:
    logits = scores(model, x).float()
    if spec.task == "classification":
        return logits.argmax(1)
    return (logits.squeeze(1) - y) * spec.target_std


def _evaluation_pass(
    ctx: FitContext,
    fit_loader: TalliedLoader,
    config: ReferenceConfig,
    columns: list[str],
    model: nn.Module,
    spec: FeatureSpec,
) -> TalliedLoader:
    """The evaluation's loader. On the CPU with DataLoader workers in a fit of one rank, a
    loader of its own whose workers read and score (:func:`scored_tensors`): as many as the
    cores the fit held, its workers' and the model's intra-op threads', since this process only
    sums what they send. The fit's workers are stopped before these fork. Elsewhere the pass
    :func:`whole_pass` gives: a GPU scores fastest, without workers there is no one else to
    score, and a rank of several keeps to the loader it already has, since its process group's
    threads run beside it and a process forked then to run the model has hung a rank."""
    workers = fit_loader.loader.num_workers
    if ctx.device.type != "cpu" or workers == 0 or ctx.world_size > 1:
        return whole_pass(ctx, fit_loader, config, columns, epoch=config.epochs + 1)
    fit_loader.stop_workers()
    score = functools.partial(
        scored_tensors, model=model, spec=spec, config=config, index=ctx.index
    )
    return _every_core_pass(ctx, workers, config, columns, score)


def _every_core_pass(
    ctx: FitContext, workers: int, config: ReferenceConfig, columns: list[str], derive: Derive
) -> TalliedLoader:
    """A loader of its own for a pass whose workers do all the work (``derive``): one worker
    per core the fit holds, its ``workers`` and the model's intra-op threads, in whole messages
    (nothing is stepped on, and a summary cannot be cut). No other loader's workers may be
    running when it forks (see :func:`whole_pass`)."""
    loader = ctx.loader(
        style=config.reader,
        batch_size=max(config.batch_size, WHOLE_PASS_ROWS),
        shuffle=False,
        num_workers=workers + torch.get_num_threads(),
        columns=columns,
    )
    loader.set_batch_size(loader.loader.message_rows)
    loader.set_derive(derive)
    return loader


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    ctx: FitContext,
    spec: FeatureSpec,
    config: ReferenceConfig,
    *,
    fit_loader: TalliedLoader,
) -> dict[str, float]:
    """Held-out and training metrics on the accepted rows with a label, summed across ranks.

    Classification: accuracy. Regression: RMSE and MAE in the label's own units.

    The pass reads as :func:`_evaluation_pass` says: on the CPU with worker processes in a fit
    of one rank, the workers read and score while this process sums; on a GPU or in a rank of
    several through the fit's own loader (``fit_loader``), one more epoch of its order, its
    workers reading while this process scores; without workers, in this process.
    """
    model.eval()  # before any worker forks with it
    index = ctx.index
    device = ctx.device
    columns = [config.label, *(c.name for c in spec.columns)]
    loader = _evaluation_pass(ctx, fit_loader, config, columns, model, spec)
    # per split (held out, train): rows, then correct (classification) or squared, abs error
    acc = torch.zeros(6, dtype=torch.float64, device=device)
    for batch in loader:
        if ANSWER in batch:  # scored where it was read
            y, ok, hold, answer = (
                tensor_to(batch[k], device) for k in (Y, SCORED, HELD_OUT, ANSWER)
            )
        else:
            t = batch_tensors(batch, spec, config, index, device)
            y, ok, hold = t[Y], t[SCORED], t[HELD_OUT]
            answer = _answer(model, t[X], y, spec)
        for k, part in enumerate((ok & hold, ok & ~hold)):
            acc[3 * k] += part.sum().double()
            if spec.task == "classification":
                acc[3 * k + 1] += ((answer == y) & part).sum().double()
            else:
                acc[3 * k + 1] += (answer * answer)[part].sum().double()
                acc[3 * k + 2] += answer.abs()[part].sum().double()
    totals = _all_sum(acc.tolist(), ctx.world_size)
    model.train()
    out: dict[str, float] = {}
    for k, name in enumerate(("holdout", "train")):
        n = totals[3 * k]
        out[f"{name}_items"] = n
        if spec.task == "classification":
            out[f"{name}_accuracy"] = totals[3 * k + 1] / n if n else math.nan
        else:
            out[f"{name}_rmse"] = math.sqrt(totals[3 * k + 1] / n) if n else math.nan
            out[f"{name}_mae"] = totals[3 * k + 2] / n if n else math.nan
    return out
