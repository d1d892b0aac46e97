"""torchrun, 2 ranks x 2 DataLoader workers, gloo on CPU: every id exactly once, no hang."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.bundles import make_bundle

SCRIPT = Path(__file__).parent / "helpers" / "torchrun_coverage.py"
ROOT = Path(__file__).resolve().parents[1]
SIZES = [1, 300, 2, 250, 100, 199, 157]  # 1,009 items, 7 uneven parts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(bundle: Path, out: Path, *extra: str, timeout: float) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(SCRIPT),
        "--bundle",
        str(bundle),
        "--out",
        str(out),
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("tr"), SIZES).root


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_two_ranks_two_workers_read_every_item_exactly_once(bundle, tmp_path):
    proc = _torchrun(bundle, tmp_path, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
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


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_without_join_uneven_ranks_fail_instead_of_finishing(bundle, tmp_path):
    """The negative control: the same loop without Join hangs in an all-reduce until gloo's
    15 s timeout (set by the script) ends it, so the test above passes only thanks to Join."""
    proc = _torchrun(bundle, tmp_path, "--no-join", timeout=90)
    assert proc.returncode != 0
    assert "Timed out waiting" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "summary-rank0.json").exists()
