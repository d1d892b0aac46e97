"""torchrun, 2 ranks x 2 DataLoader workers, gloo on CPU: every id exactly once, no hang, and an
epoch stopped by SIGKILL resumes exactly once from the loaders' saved states."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pipeline.readers import partcache
from tests.helpers.bundles import make_bundle
from tests.helpers.timing import limit
from tests.helpers.torchrun import run_torchrun

SCRIPT = Path(__file__).parents[1] / "helpers" / "torchrun_coverage.py"
RESUME_SCRIPT = Path(__file__).parents[1] / "helpers" / "torchrun_resume.py"
SIZES = [1, 300, 2, 250, 100, 199, 157]  # 1,009 items, 7 uneven parts


def _shared_dirs(out: Path, pattern: str = "pid-*") -> set[str]:
    """The decoded-part directories (MapDataset's shared parts) that the ranks whose pids are in
    ``out/<pattern>`` own: only this test's processes, whatever else reads bundles meanwhile."""
    pids = {p.read_text().strip() for p in out.glob(pattern)}
    assert pids, f"no rank wrote its pid to {out}/{pattern}"
    mine = tuple(f"{partcache.PREFIX}{partcache._pid_namespace()}-{pid}-" for pid in pids)
    return {n for n in os.listdir(out / "parts") if n.startswith(mine)}


def _torchrun(
    bundle: Path, out: Path, *extra: str, timeout: float, script: Path = SCRIPT, ranks: int = 2
) -> subprocess.CompletedProcess:
    # The ranks' shared parts in a directory of this test's own: a test elsewhere that builds a
    # dataset sweeps every dead process's directory from the default one, a killed rank's too.
    parts = {partcache.ROOT_ENV: str(out / "parts")}
    return run_torchrun(
        ranks, str(script), "--bundle", str(bundle), "--out", str(out), *extra, timeout=timeout,
        env=parts,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("tr"), SIZES).root


@pytest.mark.timeout(300)
def test_two_ranks_two_workers_read_every_item_exactly_once(bundle, tmp_path):
    proc = _torchrun(bundle, tmp_path, "--gloo-timeout", str(limit(120)), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _shared_dirs(tmp_path) == set()  # each rank removed its decoded parts when it exited
    expected = sorted(f"{i:05d}" for i in range(sum(SIZES)))
    summaries = [json.loads((tmp_path / f"summary-rank{r}.json").read_text()) for r in (0, 1)]
    for style in ("map", "iterable"):
        per_rank = [(tmp_path / f"{style}-rank{r}.txt").read_text().split() for r in (0, 1)]
        assert not set(per_rank[0]) & set(per_rank[1])  # disjoint across ranks
        assert sorted(per_rank[0] + per_rank[1]) == expected  # and complete, ids as strings
        steps = [s[style]["steps"] for s in summaries]
        assert steps[0] != steps[1], "shares must be uneven for Join to matter"
        for s in summaries:  # every rank reconciled the gathered counts the same way
            rep = s[style]["report"]
            assert rep["ok"] and rep["items_iterated"] == 1009 and rep["duplicates"] == 0
            assert rep["owners"] == 2
    assert summaries[0]["weight"] == summaries[1]["weight"]  # DDP kept the replicas in sync


@pytest.mark.timeout(300)
def test_without_join_uneven_ranks_fail_instead_of_finishing(bundle, tmp_path):
    """The negative control: the same loop without Join hangs in an all-reduce until gloo's
    15 s timeout (the script's default) ends it, so the test above passes only thanks to Join
    (which runs with a timeout long enough for a loaded machine)."""
    proc = _torchrun(bundle, tmp_path, "--no-join", timeout=180)
    assert proc.returncode != 0
    assert "Timed out waiting" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "summary-rank0.json").exists()


def _share_order(bundle: Path, rank: int) -> list[str]:
    """The ids rank ``rank`` of 2 reads map-style in epoch 1, in order (seed 7, shuffled)."""
    from pipeline.bundle.verify import verify
    from pipeline.readers import Index, OwnerSampler

    index = Index.from_snapshot(verify(bundle))
    sampler = OwnerSampler(index, rank=rank, world_size=2, shuffle=True, seed=7)
    sampler.set_epoch(1)
    ids = index.ids.to_pylist()
    return [ids[p] for p in sampler.positions()]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("k", ["first", "middle", "last"])
def test_an_epoch_killed_by_sigkill_resumes_exactly_once(bundle, tmp_path, k):
    gloo = ("--gloo-timeout", str(limit(120)))
    stopped = _torchrun(
        bundle, tmp_path, "--phase", "stop", "--k", k, *gloo, timeout=240, script=RESUME_SCRIPT
    )
    assert stopped.returncode != 0, "rank 1 was meant to die by SIGKILL"
    assert "Signal 9 (SIGKILL)" in stopped.stderr, stopped.stderr[-3000:]
    killed = _shared_dirs(tmp_path, "pid-stop-*")  # nothing runs in a killed rank: it stays...
    resumed = _torchrun(
        bundle, tmp_path, "--phase", "resume", *gloo, timeout=240, script=RESUME_SCRIPT
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert killed and not _shared_dirs(tmp_path, "pid-stop-*")  # ...until the restart sweeps it
    assert _shared_dirs(tmp_path, "pid-resume-*") == set()
    expected = sorted(f"{i:05d}" for i in range(sum(SIZES)))
    for style in ("map", "iterable"):
        every: list[str] = []
        for r in (0, 1):
            before = json.loads((tmp_path / f"stop-{style}-rank{r}.json").read_text())
            state = json.loads((tmp_path / f"state-{style}-rank{r}.json").read_text())
            summary = json.loads((tmp_path / f"resume-rank{r}.json").read_text())[style]
            assert before["batches"] >= 1 and state["rank"] == r and state["epoch"] == 1
            done = state["rows"] if style == "map" else sum(state["rows"])
            assert done == len(before["ids"])  # the state counts what was delivered, no more
            ids = before["ids"] + summary["resumed"]
            assert len(ids) == len(set(ids))  # nothing twice on this rank
            if style == "map":  # the rest of the same order, from the next position on
                assert ids == _share_order(bundle, r)
            if k == "last":
                assert summary["resumed"] == []
            for report in (summary["report"], summary["next_epoch"]):
                # every rank reconciled interrupted + resumed reads across both ranks
                assert report["ok"] and report["items_iterated"] == 1009, report
                assert report["duplicates"] == 0 and report["missing"] == 0
            every += ids
        assert sorted(every) == expected  # across ranks: every item once


@pytest.mark.timeout(600)
def test_an_epoch_cut_on_two_ranks_resumes_on_three_exactly_once(bundle, tmp_path):
    """2 ranks x 2 workers stop mid-epoch (rank 1 SIGKILLed); 3 ranks x 3 workers read the rest
    from the merged states and reconcile it with what the 2 had delivered, as one pass."""
    gloo = ("--gloo-timeout", str(limit(120)))
    stop = ("--phase", "stop", "--k", "middle", *gloo)
    stopped = _torchrun(bundle, tmp_path, *stop, timeout=240, script=RESUME_SCRIPT)
    assert "Signal 9 (SIGKILL)" in stopped.stderr, stopped.stderr[-3000:]
    reshaped = _torchrun(
        bundle, tmp_path, "--phase", "reshape", *gloo, timeout=240, script=RESUME_SCRIPT, ranks=3
    )
    assert reshaped.returncode == 0, reshaped.stderr[-3000:]
    for style in ("map", "iterable"):
        every = [
            x
            for r in (0, 1)
            for x in json.loads((tmp_path / f"stop-{style}-rank{r}.json").read_text())["ids"]
        ]
        assert every  # the cut fell mid-epoch
        for r in (0, 1, 2):
            summary = json.loads((tmp_path / f"reshape-rank{r}.json").read_text())[style]
            report = summary["report"]  # reconciled across the three ranks, the cut included
            assert report["ok"] and report["items_iterated"] == sum(SIZES), report
            assert report["duplicates"] == 0 and report["missing"] == 0
            assert summary["resumed"], f"rank {r} of 3 was given part of the rest"
            every += summary["resumed"]
        assert sorted(every) == sorted(f"{i:05d}" for i in range(sum(SIZES)))


@pytest.mark.timeout(300)
def test_ranks_with_different_worker_counts_are_refused(bundle, tmp_path):
    proc = _torchrun(bundle, tmp_path, "--phase", "mismatch", timeout=180, script=RESUME_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in (0, 1):  # every rank refuses, naming the values
        error = json.loads((tmp_path / f"mismatch-rank{r}.json").read_text())["error"]
        assert "num_workers: rank 0 = 2, rank 1 = 3" in error
