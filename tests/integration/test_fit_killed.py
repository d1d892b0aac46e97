"""A fit SIGKILLed mid-epoch resumes from its last mid-fit cut: the same model, exactly once.

Each case runs the pipeline's fit (``run_fit``, the reference trainer) in a process of its own
(forked from the test's), kills it with SIGKILL after a chosen optimizer step, and runs it again
in another process over the same progress directory, as a retried run would. Checked against
one uninterrupted fit: the same checkpoint bytes and loss curve (the cut holds the model, the
optimizer, the RNG and each loader's position, so nothing is replayed and nothing skipped), the
summary names the step it resumed after, and the interrupted pass reconciles as one pass: every
item once, none twice, none lost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import traceback
from pathlib import Path

import pytest

from pipeline.readers.index import Index
from pipeline.training import REFERENCE_TRAINER, hash_checkpoint, load_trainer, run_fit
from pipeline.training.progress import COMMITTED
from pipeline.training.runner import TrainSummary
from tests.helpers import fit_once
from tests.helpers.timing import limit, wait_until
from tests.helpers.torchrun import run_torchrun
from tests.helpers.training import EPOCHS, N, classes_index, fit_config


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Index:
    return classes_index(tmp_path_factory.mktemp("resume-fit"))


@pytest.fixture(scope="module")
def uninterrupted(index, tmp_path_factory) -> dict[str, TrainSummary]:
    """One fit per reader style that nobody killed (no cuts saved)."""
    out = {}
    for style in ("map", "iterable"):
        d = tmp_path_factory.mktemp(f"whole-{style}")
        run = run_fit(
            load_trainer(REFERENCE_TRAINER),
            index,
            fit_config(style),
            output_dir=d,
            log=lambda _: None,
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


def _fit(index: Index, out: Path, progress: Path, style: str, every: int, env: dict) -> int:
    """One fit in a process of its own, forked from this one (the modules are loaded already, so
    a case costs its fits, not interpreter starts); its exit code, or minus the signal that
    ended it."""
    pid = os.fork()
    if pid == 0:  # the child: the fit a retried run would do, then out without any cleanup
        code = 1
        try:
            os.environ.update(env)
            config = json.dumps(fit_config(style))
            fit_once.main(str(index.snapshot.root), str(out), str(progress), config, str(every))
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)

    def ended() -> tuple[int] | None:
        done, status = os.waitpid(pid, os.WNOHANG)  # (0, 0) while it runs
        return (os.waitstatus_to_exitcode(status),) if done else None

    (code,) = wait_until(ended, timeout=limit(300), what=f"the end of the fit in pid {pid}")
    return code


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
    env = {
        "FIT_TRAINER": "tests.helpers.killed_trainer:KilledOnce",
        "KILL_MARKER": str(tmp_path / "killed"),
        "KILL_AFTER": str(kill_step),  # training steps (the fitting pass does not count)
    }
    killed = _fit(index, tmp_path / "first", progress, style, every, env)
    assert killed == -signal.SIGKILL  # the child's traceback, if any, is in the captured output
    assert not (tmp_path / "first" / "summary.json").exists()
    committed = progress / COMMITTED
    if resume_step is None:
        assert not committed.exists()
    else:
        assert json.loads(committed.read_text())["step"] == resume_step

    again = _fit(index, tmp_path / "again", progress, style, every, env)
    assert again == 0
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


def _torchrun_fit(index, out: Path, progress: Path, style: str, every: int, env: dict, ranks: int):
    """The same fit under a real torchrun of ``ranks`` ranks (no restarts): its exit code."""
    proc = run_torchrun(
        ranks,
        "-m",
        "tests.helpers.fit_once",
        str(index.snapshot.root),
        str(out),
        str(progress),
        json.dumps(fit_config(style)),
        str(every),
        timeout=300,
        env=env,
    )
    if proc.returncode and "SIGKILL" not in proc.stderr:
        print(proc.stderr[-3000:])
    return proc.returncode


@pytest.mark.timeout(900)
@pytest.mark.parametrize("style", ["map", "iterable"])
def test_a_fit_cut_on_two_ranks_resumes_on_one_and_on_three_exactly_once(index, tmp_path, style):
    """Rank 1 of 2 dies mid-epoch 1, after a cut; the same fit restarted on 1 rank, and (from a
    copy of the same cut) on 3, resumes the model and the readers' positions and reconciles the
    interrupted pass as one: every item once, none twice, none lost."""
    every = 3
    env = {
        "FIT_TRAINER": "tests.helpers.killed_trainer:KilledOnce",
        "KILL_MARKER": str(tmp_path / "killed"),
        "KILL_RANK": "1",
        "KILL_AFTER": "5",  # 5 steps in: after the cut at step 3 (or later)
    }
    progress = tmp_path / "progress"
    assert _torchrun_fit(index, tmp_path / "killed-run", progress, style, every, env, 2) != 0
    assert (tmp_path / "killed").exists()
    committed = json.loads((progress / COMMITTED).read_text())
    assert committed["world_size"] == 2 and committed["step"] >= every  # a cut mid-fit
    copy = tmp_path / "progress-copy"
    shutil.copytree(progress, copy)
    for ranks, cut in ((1, progress), (3, copy)):
        out = tmp_path / f"on-{ranks}"
        if ranks == 1:
            assert _fit(index, out, cut, style, every, env) == 0
        else:
            assert _torchrun_fit(index, out, cut, style, every, env, ranks) == 0
        summary = TrainSummary.model_validate_json((out / "summary.json").read_text())
        assert summary.world_size == ranks
        assert summary.resumed is not None and summary.resumed.step == committed["step"]
        assert summary.resumed.world_size == 2  # the record names both shapes
        interrupted = summary.resumed.reconciliation
        assert interrupted.ok, interrupted.problems()
        assert interrupted.items_iterated == N
        assert interrupted.duplicates == 0 and interrupted.missing == 0
        assert summary.reconciliation.ok and summary.reconciliation.items_iterated == N
        assert len(summary.loss_curve) == EPOCHS
        assert not cut.exists()  # the finished checkpoint supersedes the cuts
