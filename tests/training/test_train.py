"""The reference trainer through the trainer interface: features, targets, nulls, fit, predict."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.readers import POSITION_KEY, make_loader, set_epoch
from pipeline.readers.index import Index
from pipeline.readers.reconcile import keyed_coverage
from pipeline.training import (
    FitResult,
    Trainer,
    TrainerError,
    features,
    load_trainer,
)
from pipeline.training.features import holdout_mask
from tests.helpers.bundles import stage_result
from tests.helpers.readers import uneven_index
from tests.helpers.refusals import one_line_refusal
from tests.helpers.training import train

N = 1009


def _stage(tmp_path: Path, table: pa.Table, name: str = "bundle") -> Index:
    return Index.from_snapshot(stage_result(table, tmp_path / name, rows_per_part=150))


def _table(rng: np.random.Generator, y: np.ndarray, x: np.ndarray) -> dict[str, pa.Array]:
    """Result columns around ``x``: ~10% failed, ~10% abstained, nulls in every feature type."""
    n = len(y)
    u = rng.random(n)
    status = np.where(u < 0.1, "failed", np.where(u < 0.2, "abstained", "accepted"))
    holes = rng.random(n) < 0.05  # rows with a null in each nullable feature
    flat = pa.array(x.ravel())
    vec = pa.FixedSizeListArray.from_arrays(flat, x.shape[1], mask=pa.array(holes))
    day0 = datetime(2026, 1, 1, tzinfo=UTC)
    maybe = [None if h else int(v) for h, v in zip(holes, y, strict=True)]
    return {
        "id": pa.array([f"{i:05d}" for i in range(n)]),
        "x": vec,  # fixed_size_list<float32,8>, nullable: some rows null
        "scalar": pa.array(np.where(holes, np.nan, rng.normal(size=n)), from_pandas=True),
        "count": pa.array(maybe, pa.int32()),
        "flag": pa.array([None if v is None else bool(v % 2) for v in maybe]),
        "seen": pa.array([day0 + timedelta(hours=i) for i in range(n)], pa.timestamp("us", "UTC")),
        "note": pa.array(["n"] * n),
        "lithi_status": pa.array(status),
        "lithi_confidence": pa.array([None if s == "failed" else 0.9 for s in status], "float32"),
        "lithi_verification": pa.array(["agree"] * n),
    }  # fmt: skip


@pytest.fixture(scope="module")
def classes(tmp_path_factory) -> Index:
    """Three separable classes, labelled with strings (only where accepted)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, N)
    x = (rng.normal(size=(N, 8)) + 3 * y[:, None]).astype(np.float32)
    cols = _table(rng, y, x)
    names = np.array(["cat", "dog", "eel"])[y]
    status = cols["lithi_status"].to_pylist()
    cols["lithi_label"] = pa.array(
        [str(v) if s == "accepted" else None for v, s in zip(names, status, strict=True)]
    )
    cols["truth"] = pa.array(y, pa.int64())  # ground truth: must never be used silently
    return _stage(tmp_path_factory.mktemp("cls"), pa.table(cols))


@pytest.fixture(scope="module")
def values(tmp_path_factory) -> Index:
    """A continuous target: 2*x0 - x1 + noise, in the label's own units (around 100)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(N, 8)).astype(np.float32)
    y = 100 + 10 * (2 * x[:, 0] - x[:, 1]) + rng.normal(scale=0.5, size=N)
    cols = _table(rng, np.zeros(N, np.int64), x)
    cols["target"] = pa.array(y, pa.float64())
    return _stage(tmp_path_factory.mktemp("reg"), pa.table(cols))


FEATURES = ["x", "scalar", "count", "flag", "seen"]


def _fit(index: Index, config: dict, out: Path, *, workers: int | None = None):
    """The reference trainer's fit of ``index`` in this process, into ``out``."""
    from pipeline.training import REFERENCE_TRAINER, load_trainer, run_fit

    out.mkdir(parents=True, exist_ok=True)
    kw = {} if workers is None else {"num_workers": workers}
    return run_fit(
        load_trainer(REFERENCE_TRAINER), index, config, output_dir=out, log=lambda _: None, **kw
    )


def test_classification_with_string_labels_and_nulls_in_every_feature_type(classes, tmp_path):
    config = {"label": "lithi_label", "features": FEATURES, "epochs": 6}
    result, report, passes, files, table = train(classes, tmp_path / "ckpt", config)
    assert result.metrics["holdout_accuracy"] > 0.9, result.metrics
    assert report.ok and report.items_iterated == len(classes) and passes == 6 + 2
    assert result.features.used == FEATURES and result.features.dropped == {}
    assert list(files.files) == ["model.pt"]
    assert not (tmp_path / "ckpt" / "model.pt").stat().st_mode & 0o222  # read-only once hashed
    assert keyed_coverage(classes.ids, table.column("id")).ok
    assert set(table.column("prediction").to_pylist()) <= {"cat", "dog", "eel"}
    assert set(table.column("lithi_status").to_pylist()) == {"accepted", "failed", "abstained"}
    assert set(table.column("checkpoint_sha256").to_pylist()) == {files.sha256}


@pytest.mark.parametrize("reader", ["map", "iterable"])
def test_the_mixing_shuffle_trains_and_reconciles_each_pass_exactly_once(classes, tmp_path, reader):
    config = {"label": "lithi_label", "features": FEATURES, "epochs": 4, "mix": True}
    result, report, passes, _, _ = train(classes, tmp_path / "ckpt", {**config, "reader": reader})
    assert report.ok and report.items_iterated == len(classes) and passes == 4 + 2
    assert report.duplicates == 0 and report.missing == 0
    assert result.metrics["holdout_accuracy"] > 0.9, result.metrics
    assert torch.load(tmp_path / "ckpt" / "model.pt")["config"]["mix"] is True


def test_regression_reports_rmse_and_mae_in_the_labels_units(values, tmp_path):
    config = {"task": "regression", "label": "target", "features": ["x"], "epochs": 8}
    result, report, _, _, table = train(values, tmp_path / "ckpt", config)
    assert report.ok
    assert "holdout_accuracy" not in result.metrics
    assert result.metrics["holdout_rmse"] < 8 and result.metrics["holdout_mae"] < 6  # std ~22
    assert table.column("prediction").type == pa.float64()
    assert 60 < float(np.mean(table.column("prediction").to_numpy())) < 140


def test_a_float_target_is_refused_for_classification(values, tmp_path):
    with pytest.raises(TrainerError, match="'target' is float64: .* use task 'regression'"):
        train(values, tmp_path / "c", {"label": "target", "features": ["x"], "epochs": 1})


def test_features_are_never_chosen_silently(classes, tmp_path):
    with pytest.raises(TrainerError, match="name the feature columns"):
        train(classes, tmp_path / "a", {"label": "lithi_label", "epochs": 1})
    auto = {"label": "lithi_label", "auto_features": True, "exclude": ["truth"], "epochs": 1}
    result, *_ = train(classes, tmp_path / "b", auto)
    assert result.features.used == FEATURES  # declared order, numeric only
    dropped = result.features.dropped
    assert dropped["truth"] == "excluded by the config"
    assert dropped["note"].startswith("string")
    assert dropped["id"] == "the item id" and dropped["lithi_label"] == "the label"
    assert dropped["lithi_confidence"] == "a lithi_* result column"


@pytest.mark.parametrize(
    ("features", "message"),
    [
        (["nope"], "'nope' is not a column of this bundle \\(did you mean 'note'\\?\\)"),
        (["x", "x"], "'x' is named twice"),
    ],
)
def test_an_unusable_explicit_feature_is_named(classes, tmp_path, features, message):
    with pytest.raises(TrainerError, match=message):
        train(classes, tmp_path / "c", {"label": "lithi_label", "features": features})


def test_a_trainer_that_reads_nothing_does_not_reconcile(classes, tmp_path):
    class Lazy(Trainer):
        def fit(self, ctx):
            (ctx.output_dir / "w.txt").write_text("0")
            return FitResult()

        def predict(self, ctx):
            return pa.table({"id": ctx.index.ids})

    result, report, passes, files, table = train(classes, tmp_path / "c", {}, Lazy())
    assert not report.ok and report.items_iterated == 0 and passes == 0
    assert "short by 1009" in report.problems()[0]
    assert keyed_coverage(classes.ids, table.column("id")).ok


def test_an_interrupted_pass_is_not_counted(classes, tmp_path):
    class Quitter(Trainer):
        def fit(self, ctx):
            loader = ctx.loader(batch_size=64, num_workers=0)
            for _ in loader:
                pass  # one full pass
            for _ in loader:
                break  # and one abandoned at its first batch
            (ctx.output_dir / "w.txt").write_text("0")
            return FitResult()

        def predict(self, ctx):
            return pa.table({"id": ctx.index.ids})

    _, report, passes, *_ = train(classes, tmp_path / "c", {}, Quitter())
    assert report.ok and passes == 1


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon", "expected 'package.module:ClassName'"),
        ("no.such.module:T", "cannot import 'no.such.module'"),
        ("pipeline.training:Nope", "has no 'Nope'"),
        ("pipeline.training:FitResult", "not a subclass of pipeline.training.Trainer"),
    ],
)
def test_a_bad_trainer_path_is_one_line_naming_it(path, message):
    refusal = one_line_refusal(TrainerError, load_trainer, path)
    assert refusal.startswith(f"trainer {path!r}") and message in refusal


def test_holdout_is_a_function_of_the_id_alone():
    ids = [f"item-{i}" for i in range(2000)]
    mask = holdout_mask(ids, 20)
    assert 300 < int(mask.sum()) < 500
    again = holdout_mask(list(reversed(ids)), 20)
    assert torch.equal(mask, again.flip(0))  # order, seed and process never move an item
    assert not holdout_mask(ids, 0).any()


def test_holdout_by_position_is_the_id_rule_hashed_once_per_index(tmp_path, monkeypatch):
    """A reader's batch is looked up by its rows' index positions: the same rows as hashing
    each batch's ids, with the index's ids hashed once for every pass and batch."""
    index = uneven_index(tmp_path)
    hashed: list[int] = []
    real = features.holdout_flags
    monkeypatch.setattr(
        features, "holdout_flags", lambda ids, p: hashed.append(len(ids)) or real(ids, p)
    )
    loader = make_loader(index, style="iterable", batch_size=50, shuffle=True, seed=4)
    for epoch in (1, 2):
        set_epoch(loader, epoch)
        for batch in loader:
            by_id = real(pa.array(batch[index.id_field], pa.string()), 20)
            assert features.batch_holdout(batch, index, 20).tolist() == by_id.tolist()
    assert hashed == [len(index)]  # once, for both epochs' batches
    del batch[POSITION_KEY]  # a batch built by hand: its ids are hashed
    assert torch.equal(features.batch_holdout(batch, index, 20), holdout_mask(batch["item_id"], 20))
    assert hashed[1:] == [len(batch["item_id"])] * 2


def test_the_prediction_table_says_which_rows_were_held_out(classes, tmp_path):
    """The split is visible: comparing against a baseline on the same held-out rows needs no
    internal function. Held-out accepted rows are the ones the holdout metrics count."""
    config = {"label": "lithi_label", "features": FEATURES, "epochs": 1, "holdout_percent": 30}
    result, _, _, _, table = train(classes, tmp_path / "ckpt", config)
    held = table.column("holdout")
    assert held.type == pa.bool_() and held.null_count == 0
    ids = table.column("id").to_pylist()
    assert held.to_pylist() == holdout_mask(ids, 30).tolist()
    accepted = np.array(table.column("lithi_status").to_pylist()) == "accepted"
    assert (
        int((held.to_numpy(zero_copy_only=False) & accepted).sum())
        == result.metrics["holdout_items"]
    )


@pytest.mark.parametrize("reader", ["map", "iterable"])
def test_with_workers_the_fitting_pass_and_evaluation_fork_their_own_once_the_others_stop(
    classes, tmp_path, reader, monkeypatch
):
    # The fit's workers derive each batch's tensors, so this process only steps; the fitting
    # pass's workers and the evaluation's, one per core the fit held, read and sum or score, so
    # it only adds. Each loader forks only once the others' workers are stopped: a loader's
    # workers forked beside another's persistent ones could hang a rank (make demo once did).
    import multiprocessing

    from pipeline.training import fit as fit_module
    from pipeline.training.trainer import _Context

    built: list[int | None] = []
    alive_at_build: list[list] = []
    original = _Context.loader

    def counted(self, **kw):
        built.append(kw.get("num_workers"))
        alive_at_build.append(multiprocessing.active_children())
        return original(self, **kw)

    pids = tmp_path / "derived-in"  # appended to by whichever process derives a batch
    scored = tmp_path / "scored-in"
    real_fit_tensors, real_answer = fit_module.fit_tensors, fit_module._answer

    def noted(*args, **kw):
        with pids.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return real_fit_tensors(*args, **kw)

    def answered(*args, **kw):
        with scored.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return real_answer(*args, **kw)

    monkeypatch.setattr(_Context, "loader", counted)
    monkeypatch.setattr(fit_module, "fit_tensors", noted)
    monkeypatch.setattr(fit_module, "_answer", answered)
    config = {"label": "lithi_label", "features": ["x"], "epochs": 2, "reader": reader}
    metrics = {}
    here = str(os.getpid())
    for workers in (1, 0):
        built.clear()
        alive_at_build.clear()
        out = tmp_path / f"w{workers}"
        run = _fit(classes, config, out, workers=workers)
        assert run.reconciliation.ok and run.passes == 2 + 2
        metrics[workers] = run.result.metrics
        derived_in = set(pids.read_text().split())
        scored_in = set(scored.read_text().split())
        pids.unlink()
        scored.unlink()
        if workers:
            # the fit's loader, then the fitting pass's and the evaluation's, each with more
            # workers than the fit had, forked when no other loader's were running
            assert len(built) == 3 and built[0] is None, built
            assert built[1] > workers and built[2] > workers, built
            assert alive_at_build[1:] == [[], []], "another loader's workers were running"
            assert derived_in and scored_in and here not in derived_in | scored_in
        else:  # the fitting pass and the evaluation each read in-process, in larger batches
            assert built == [None, 0, 0]
            assert derived_in == scored_in == {here}
    # the same rows scored either way: counts and accuracy are exact
    assert metrics[1] == metrics[0], metrics


def test_in_a_rank_of_several_the_evaluation_reads_through_the_fits_own_loader(classes):
    # A rank of several holds a process group whose threads run beside it; the evaluation forks
    # no loader of its own there, it reads one more epoch through the fit's loader and workers.
    from pipeline.training import fit as fit_module
    from pipeline.training.reference import ReferenceConfig
    from pipeline.training.trainer import _Context

    ctx = _Context(
        index=classes, config={}, rank=0, world_size=2, num_workers=1, log=lambda _: None
    )
    config = ReferenceConfig(label="lithi_label", features=["x"], epochs=1, batch_size=16)
    fit_loader = ctx.loader(batch_size=16, shuffle=True, num_workers=1)
    for _ in fit_loader:  # the fit's epoch: its persistent workers stay up after it
        pass
    built = []
    ctx.loader = lambda **kw: built.append(kw)  # type: ignore[method-assign]
    passed = fit_module._evaluation_pass(
        ctx, fit_loader, config, ["lithi_label", "x"], torch.nn.Linear(8, 2), spec=None
    )
    assert passed is fit_loader and built == []
    assert fit_loader.loader.epoch == config.epochs + 1
    rows = sum(len(b[POSITION_KEY]) for b in passed)
    assert rows == len(fit_loader.loader.sampler), "one more whole epoch of this rank's share"
    fit_loader.stop_workers()


#: A float32 below the smallest normal one (1.18e-38): kept as it is by default, read as zero
#: when the CPU flushes denormals.
DENORMAL = 1e-39


def _denormal_survives() -> bool:
    return torch.tensor([DENORMAL], dtype=torch.float32).mul(1.0).item() != 0.0


@pytest.mark.parametrize("flush", [True, False])
def test_the_fit_flushes_denormals_on_the_cpu_unless_told_not_to(
    classes, tmp_path, monkeypatch, flush
):
    # Adam's moments and the gradients of units that stop firing decay into denormals over
    # thousands of steps, and every one of them makes a CPU float operation tens of times
    # slower: at 10^7 items the backward pass took most of the step (docs/performance.md).
    from pipeline.training import fit as fit_module

    seen: list[bool] = []
    built = fit_module.model_for

    def recording(spec, hidden):
        model = built(spec, hidden)
        model.register_forward_hook(lambda *_: seen.append(_denormal_survives()))
        return model

    monkeypatch.setattr(fit_module, "model_for", recording)
    config = {"label": "lithi_label", "features": ["x"], "epochs": 1}
    if not flush:
        config["flush_denormals"] = False
    run = _fit(classes, config, tmp_path)
    assert run.reconciliation.ok
    assert seen and set(seen) == {not flush}, seen
    assert _denormal_survives()  # the thread's mode is as it was once the fit returns


def test_the_model_scores_large_cpu_batches_in_cache_sized_slices(tmp_path, monkeypatch):
    # Whole worker messages (evaluation) and 8,192-row prediction batches keep the per-batch
    # Python work rare, but the MLP's activations for that many rows leave a core's cache: one
    # forward of 8,192 rows scored 0.9 M rows/s against 1.4 M in slices of 1,024.
    from pipeline.training import fit as fit_module
    from pipeline.training import predict as predict_module
    from pipeline.training.model import CPU_FORWARD_ROWS

    n = 3 * CPU_FORWARD_ROWS
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, n)
    x = (rng.normal(size=(n, 4)) + 2 * y[:, None]).astype(np.float32)
    cols = _table(rng, y, x)
    cols["lithi_label"] = pa.array(y, pa.int64())
    index = _stage(tmp_path, pa.table(cols))
    scored: list[int] = []  # rows per forward call with autograd off: evaluation, prediction

    def record(model):
        model.register_forward_hook(
            lambda _m, args, _out: None if torch.is_grad_enabled() else scored.append(len(args[0]))
        )
        return model

    built, loaded = fit_module.model_for, predict_module.load_checkpoint

    def loading(path):
        model, spec = loaded(path)
        return record(model), spec

    monkeypatch.setattr(fit_module, "model_for", lambda *a: record(built(*a)))
    monkeypatch.setattr(predict_module, "load_checkpoint", loading)
    config = {"label": "lithi_label", "features": ["x"], "epochs": 1, "batch_size": n}
    _, report, _, _, table = train(index, tmp_path / "out", config)
    assert report.ok and table.num_rows == n
    assert scored and max(scored) <= CPU_FORWARD_ROWS, sorted(set(scored))
    assert sum(scored) == 2 * n  # every row scored once by the evaluation, once by prediction


def test_the_fits_adam_steps_fused_on_the_cpu(classes, tmp_path, monkeypatch):
    # torch's default Adam on the CPU loops over a dozen small operations per parameter, a
    # tenth of the reference model's step; fused, it is one kernel per parameter.

    stepped: list[object] = []
    original = torch.optim.Adam

    class Recording(original):  # type: ignore[misc, valid-type]
        def step(self, closure=None):
            stepped.append(self.param_groups[0]["fused"])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "Adam", Recording)
    config = {"label": "lithi_label", "features": ["x"], "epochs": 1}
    run = _fit(classes, config, tmp_path)
    assert run.reconciliation.ok
    assert stepped and set(stepped) == {True}, stepped


def test_on_the_cpu_a_step_computes_only_the_rows_that_weigh_something(
    classes, tmp_path, monkeypatch
):
    # A held-out row, a row not accepted and one without a label weigh 0: the step's loss and
    # gradients are the same without them, and computing them would cost a trained row's time.
    from pipeline.training import fit as fit_module

    stepped: list[tuple[int, float]] = []
    real_step = fit_module.train_step

    def recorded(net, opt, x, y, w, sums, config):
        stepped.append((x.shape[0], float(w.min()) if len(w) else 1.0))
        return real_step(net, opt, x, y, w, sums, config)

    def every_row(batch, spec, config, index, device):  # what a step computed before
        t = fit_module.batch_tensors(batch, spec, config, index, device)
        return t[fit_module.X], t[fit_module.Y], t[fit_module.WEIGHT]

    monkeypatch.setattr(fit_module, "train_step", recorded)
    config = {"label": "lithi_label", "features": ["x", "scalar"], "epochs": 2}
    runs = {}
    for name in ("kept", "every"):
        if name == "every":
            monkeypatch.setattr(fit_module, "training_rows", every_row)
        stepped.clear()
        out = tmp_path / name
        runs[name] = _fit(classes, config, out, workers=0)
        assert runs[name].reconciliation.ok
        rows = sum(n for n, _ in stepped)
        if name == "kept":
            kept_rows, kept_steps = rows, len(stepped)
            assert all(least > 0 for _, least in stepped), "a row weighing 0 was computed"
        else:
            every_rows, every_steps = rows, len(stepped)
    assert every_rows == 2 * N  # every row of both epochs, before
    # the rows that weigh something: accepted, labelled, not held out (about 64% here)
    assert 0.5 * every_rows < kept_rows < 0.75 * every_rows, (kept_rows, every_rows)
    assert kept_steps == every_steps  # every batch still steps (DDP ranks step together)
    kept, every = runs["kept"].result, runs["every"].result
    assert kept.loss_curve == pytest.approx(every.loss_curve, rel=1e-5)
    assert kept.metrics == pytest.approx(every.metrics, rel=1e-3)


def test_with_workers_the_fitting_pass_is_summed_where_it_is_read(classes, tmp_path, monkeypatch):
    # The fitting pass only sums: each worker sums the rows it reads and this process adds
    # their sums, rather than receive every feature value through the pipe and sum it here.
    from pipeline.training import feature_fit

    where = tmp_path / "summed-in"
    real_add = feature_fit._Fitting.add

    def noted(self, into, batch):
        with where.open("a") as f:
            f.write(f"{os.getpid()} {sorted(k for k in batch if not k.startswith('lithi_'))}\n")
        return real_add(self, into, batch)

    monkeypatch.setattr(feature_fit._Fitting, "add", noted)
    config = {"label": "lithi_label", "features": ["x", "scalar", "count"], "epochs": 1}
    specs = {}
    for workers in (1, 0):
        out = tmp_path / f"w{workers}"
        run = _fit(classes, config, out, workers=workers)
        assert run.reconciliation.ok
        specs[workers] = torch.load(out / "model.pt", weights_only=False)["spec"]
        lines = where.read_text().splitlines()
        where.unlink()
        pids = {line.split()[0] for line in lines}
        if workers:
            assert pids and str(os.getpid()) not in pids  # summed in the worker alone
        else:
            assert pids == {str(os.getpid())}
        assert all("'x'" in line for line in lines)  # each summed batch had the columns
    # the same rows summed either way (in another order: the last bits may differ)
    for key in ("mean", "std"):
        assert specs[1][key] == pytest.approx(specs[0][key], rel=1e-12)
    assert {k: v for k, v in specs[1].items() if k not in ("mean", "std")} == {
        k: v for k, v in specs[0].items() if k not in ("mean", "std")
    }
