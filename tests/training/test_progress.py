"""Mid-fit cuts (``pipeline.training.progress``): committed only whole, refused when they belong
to another world size or another run's config or split.

A fit SIGKILLed mid-epoch and resumed from its cuts, in a process of its own, is
``tests/integration/test_fit_killed.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal

import pytest
import torch

from pipeline.readers.index import Index
from pipeline.training import REFERENCE_TRAINER, run_fit
from pipeline.training.progress import COMMITTED, Progress, ProgressError
from pipeline.training.reference import ReferenceTrainer
from pipeline.training.runner import progress_key
from tests.helpers.timing import limit
from tests.helpers.training import classes_index, fit_config


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Index:
    return classes_index(tmp_path_factory.mktemp("resume-fit"))


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


def test_a_cut_of_another_world_size_hands_every_ranks_part(tmp_path):
    # a cut of two ranks, written as two ranks would (without a process group to run them)
    Progress(tmp_path, every=1).save(1, shared={"s": 1}, local={"l": 0})
    (tmp_path / "step-0000000001" / "rank-1.pt").write_bytes(
        (tmp_path / "step-0000000001" / "rank-0.pt").read_bytes()
    )
    (tmp_path / COMMITTED).write_text(json.dumps({"step": 1, "world_size": 2}))
    for world in (1, 3):
        got = Progress(tmp_path, rank=0, world_size=world, every=1).load()
        assert got is not None and got.world_size == 2 and got.local is None
        assert got.shared == {"s": 1} and got.locals == [{"l": 0}, {"l": 0}]
    same = Progress(tmp_path, rank=1, world_size=2, every=1).load()
    assert same is not None and same.local == {"l": 0}


def test_a_cut_missing_a_rank_is_refused(tmp_path):
    Progress(tmp_path, every=1).save(1, shared={}, local={})
    (tmp_path / COMMITTED).write_text(json.dumps({"step": 1, "world_size": 2}))
    with pytest.raises(ProgressError, match="rank 1's part is missing"):
        Progress(tmp_path, rank=0, world_size=3, every=1).load()


def test_a_changed_config_never_resumes_another_runs_cuts_and_a_new_shape_does(index):
    base = progress_key(index, REFERENCE_TRAINER, fit_config("map"))
    assert base == progress_key(index, REFERENCE_TRAINER, fit_config("map"))
    others = {
        progress_key(index, REFERENCE_TRAINER, fit_config("iterable")),
        progress_key(index, "my.pkg:Trainer", fit_config("map")),
    }
    assert base not in others and len(others) == 2


def test_every_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match=">= 0"):
        Progress(tmp_path, every=-1)
    assert not Progress(tmp_path, every=0).due(10)
    assert Progress(tmp_path, every=5).due(10) and not Progress(tmp_path, every=5).due(11)
    assert not Progress(None, every=5).due(10)


# -- one live fit per cut ---------------------------------------------------------------------
def test_a_second_fit_on_cuts_another_holds_is_refused_in_one_line(tmp_path):
    cuts = tmp_path / "key"
    with Progress(cuts, every=2).claimed():
        with pytest.raises(ProgressError) as err, Progress(cuts, every=2).claimed(wait=0):
            pytest.fail("two fits held the same cuts")
    message = str(err.value)
    assert "another fit holds these cuts" in message and f"pid {os.getpid()}" in message
    assert "\n" not in message
    with Progress(cuts, every=2).claimed(wait=0):  # released when the first fit ended
        pass


def _hold_claim(cuts, ready) -> None:
    with Progress(cuts, every=2).claimed():
        ready.set()
        signal.pause()


def test_the_claim_of_a_killed_fit_is_taken_over(tmp_path):
    cuts = tmp_path / "key"
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_claim, args=(cuts, ready))
    holder.start()
    try:
        assert ready.wait(timeout=limit(60)), "the holder never took the claim"
        with pytest.raises(ProgressError, match=f"pid {holder.pid} "):
            with Progress(cuts, every=2).claimed(wait=0):
                pass
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # no cleanup runs: the kernel drops its lock
        holder.join(timeout=limit(60))
    with Progress(cuts, every=2).claimed(wait=0):
        assert not cuts.exists() or not (cuts / COMMITTED).exists()


def test_run_fit_refuses_before_training_while_another_fit_holds_its_cuts(index, tmp_path):
    cuts = tmp_path / "cuts"
    fitted = []

    class Recording(ReferenceTrainer):
        def fit(self, ctx):
            fitted.append(ctx.rank)
            return super().fit(ctx)

    with Progress(cuts, every=1).claimed():
        with pytest.raises(ProgressError, match="another fit holds these cuts"):
            run_fit(
                Recording(),
                index,
                fit_config("map"),
                output_dir=tmp_path / "ckpt",
                log=lambda _: None,
                progress_dir=cuts,
                checkpoint_every=1,
                claim_wait=0,
            )
    assert fitted == []
