"""A fit SIGKILLed mid-epoch resumes from its last mid-fit cut: the same model, exactly once.

Each case runs the pipeline's fit (``run_fit``, the reference trainer) in its own process, kills
it with SIGKILL after a chosen optimizer step, and runs it again over the same progress
directory, as a retried run would. Checked against one uninterrupted fit: the same checkpoint
bytes and loss curve (the cut holds the model, the optimizer, the RNG and each loader's position,
so nothing is replayed and nothing skipped), the summary names the step it resumed after, and
the interrupted pass reconciles as one pass: every item once, none twice, none lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.readers.index import Index
from pipeline.training import REFERENCE_TRAINER, hash_checkpoint, load_trainer, run_fit
from pipeline.training.progress import COMMITTED, Progress, ProgressError
from pipeline.training.runner import TrainSummary, progress_key
from resources.settings import REPO_ROOT
from tests.helpers.bundles import stage_result

N = 400  # 13 batches of 32 per epoch: the fitting pass, then EPOCHS epochs of 13 steps
BATCH = 32
EPOCHS = 3


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Index:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, N)
    x = (rng.normal(size=(N, 8)) + 2 * y[:, None]).astype(np.float32)
    status = np.where(rng.random(N) < 0.15, "abstained", "accepted")
    table = pa.table(
        {
            "id": pa.array([f"item-{i:04d}" for i in range(N)]),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 8),
            "lithi_status": pa.array(status),
            "lithi_label": pa.array(
                [str(v) if s == "accepted" else None for v, s in zip(y, status, strict=True)]
            ),
            "lithi_confidence": pa.array([0.5 + 0.5 * rng.random() for _ in range(N)], "float32"),
            "lithi_verification": pa.array(["agree"] * N),
        }
    )
    snap = stage_result(table, tmp_path_factory.mktemp("resume-fit") / "bundle", 150)
    return Index.from_snapshot(snap)


def _config(style: str) -> dict:
    return {
        "features": ["x"],
        "epochs": EPOCHS,
        "batch_size": BATCH,
        "reader": style,
        "seed": 5,
    }


@pytest.fixture(scope="module")
def uninterrupted(index, tmp_path_factory) -> dict[str, TrainSummary]:
    """One fit per reader style that nobody killed (no cuts saved)."""
    out = {}
    for style in ("map", "iterable"):
        d = tmp_path_factory.mktemp(f"whole-{style}")
        run = run_fit(
            load_trainer(REFERENCE_TRAINER), index, _config(style), output_dir=d, log=lambda _: None
        )
        out[style] = TrainSummary(
            metrics=run.result.metrics,
            loss_curve=run.result.loss_curve,
            features=run.result.features,
            reconciliation=run.reconciliation,
            passes=run.passes,
            checkpoint=hash_checkpoint(d),
            world_size=1,
        )
    return out


def _fit(index: Index, out: Path, progress: Path, style: str, every: int, env: dict):
    cmd = [
        sys.executable, "-m", "tests.helpers.fit_once", str(index.snapshot.root), str(out),
        str(progress), json.dumps(_config(style)), str(every),
    ]  # fmt: skip
    return subprocess.run(
        cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    "style,every,kill_step,resume_step",
    [
        ("map", 5, 1, None),  # killed before the first cut: starts over
        ("map", 5, 11, 10),  # mid-epoch 1, one step after a cut
        ("map", 5, 25, 25),  # right after the cut was committed: nothing to redo
        ("map", 13, 14, 13),  # a cut on the last batch of an epoch, killed on the next
        ("iterable", 5, 23, 20),  # mid-epoch 2, mid-part
        ("iterable", 5, 39, 35),  # on the last batch of the last epoch
    ],
)
def test_a_killed_fit_resumes_from_its_last_cut_exactly_once(
    index, uninterrupted, tmp_path, style, every, kill_step, resume_step
):
    progress = tmp_path / "progress"
    batches = -(-N // BATCH)
    env = {
        **os.environ,
        "FIT_TRAINER": "tests.helpers.killed_trainer:KilledOnce",
        "KILL_MARKER": str(tmp_path / "killed"),
        "KILL_AFTER": str(batches + kill_step),  # the fitting pass comes first
        "OMP_NUM_THREADS": "1",
    }
    killed = _fit(index, tmp_path / "first", progress, style, every, env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (tmp_path / "first" / "summary.json").exists()
    committed = progress / COMMITTED
    if resume_step is None:
        assert not committed.exists()
    else:
        assert json.loads(committed.read_text())["step"] == resume_step

    again = _fit(index, tmp_path / "again", progress, style, every, env)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = TrainSummary.model_validate_json((tmp_path / "again" / "summary.json").read_text())
    whole = uninterrupted[style]
    if resume_step is None:
        assert summary.resumed is None
    else:
        assert summary.resumed is not None and summary.resumed.step == resume_step
        interrupted = summary.resumed.reconciliation
        assert interrupted.ok, interrupted.problems()
        assert interrupted.items_iterated == N and interrupted.duplicates == 0
        assert interrupted.missing == 0
    # The same model as if nothing had happened: weights, optimizer path, data order, loss.
    assert summary.loss_curve == whole.loss_curve
    assert summary.checkpoint.sha256 == whole.checkpoint.sha256
    assert summary.reconciliation.ok and summary.reconciliation.items_iterated == N
    assert not progress.exists()  # the finished checkpoint supersedes the cuts


def test_a_cut_is_committed_only_when_every_part_is_written(tmp_path):
    progress = Progress(tmp_path, every=2)
    assert progress.load() is None
    progress.save(2, shared={"w": torch.ones(2)}, local={"rows": 7})
    # A later save that died before its commit: a part on disk, no commit naming it.
    (tmp_path / "step-0000000004").mkdir()
    (tmp_path / "step-0000000004" / "rank-0.pt").write_bytes(b"half")
    found = Progress(tmp_path, every=2).load()
    assert found is not None and found.step == 2 and found.local == {"rows": 7}
    assert torch.equal(found.shared["w"], torch.ones(2))
    progress.save(6, shared={}, local={})
    assert [p.name for p in sorted(tmp_path.glob("step-*"))] == ["step-0000000006"]


def test_a_cut_of_another_world_size_or_missing_a_rank_is_refused(tmp_path):
    Progress(tmp_path, every=1).save(1, shared={}, local={})
    with pytest.raises(ProgressError, match="world size 1, this fit runs with 2"):
        Progress(tmp_path, rank=1, world_size=2, every=1).load()
    (tmp_path / COMMITTED).write_text(json.dumps({"step": 1, "world_size": 2}))
    with pytest.raises(ProgressError, match="rank 1's part is missing"):
        Progress(tmp_path, rank=1, world_size=2, every=1).load()


def test_a_changed_config_or_split_never_resumes_another_runs_cuts(index):
    base = progress_key(index, REFERENCE_TRAINER, _config("map"), world_size=1, num_workers=0)
    assert base == progress_key(
        index, REFERENCE_TRAINER, _config("map"), world_size=1, num_workers=0
    )
    others = {
        progress_key(index, REFERENCE_TRAINER, _config("iterable"), world_size=1, num_workers=0),
        progress_key(index, REFERENCE_TRAINER, _config("map"), world_size=2, num_workers=0),
        progress_key(index, REFERENCE_TRAINER, _config("map"), world_size=1, num_workers=2),
        progress_key(index, "my.pkg:Trainer", _config("map"), world_size=1, num_workers=0),
    }
    assert base not in others and len(others) == 4


def test_every_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match=">= 0"):
        Progress(tmp_path, every=-1)
    assert not Progress(tmp_path, every=0).due(10)
    assert Progress(tmp_path, every=5).due(10) and not Progress(tmp_path, every=5).due(11)
    assert not Progress(None, every=5).due(10)
