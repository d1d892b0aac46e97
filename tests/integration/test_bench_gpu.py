"""bench/gpu.py runs with the core's dependencies only, says when there is no CUDA, and its
``--allow-cpu`` mode carries the same epochs through to an exact reconciliation (no timing is
asserted: its figures are for a GPU machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.timing import limit

ROOT = Path(__file__).resolve().parents[2]

#: Runs the bench in a process where importing Dagster, assets or resources fails.
NO_DAGSTER = (
    "import runpy, sys\n"
    "class _NoDagster:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('dagster', 'dagster_pipes', 'assets', 'resources'):\n"
    "            raise ImportError(f'bench/gpu.py imported {name}')\n"
    "sys.meta_path.insert(0, _NoDagster())\n"
    "sys.argv = ['bench/gpu.py', *sys.argv[1:]]\n"
    "runpy.run_path('bench/gpu.py', run_name='__main__')\n"
)


def _bench(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", NO_DAGSTER, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=limit(540),
        env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: it would measure")
def test_without_cuda_it_says_so_and_exits_0(tmp_path):
    out = _bench(tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no CUDA device" in out.stdout
    assert list(tmp_path.glob("lithi-gpu-*")) == [], "nothing staged"


def test_the_cpu_run_reconciles_both_epochs_exactly_once_and_cleans_up(tmp_path):
    out = _bench("--allow-cpu", "--items", "6000", "--workers", "1", tmp_path=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert "reconciled mlp epoch: 6,000/6,000 0 dup 0 missing, statuses match" in lines
    assert "reconciled wide epoch: 6,000/6,000 0 dup 0 missing, statuses match" in lines
    summary = lines[-1]
    assert summary.startswith("cpu: h2d ") and "reconciled 6000/6000 0 dup 0 missing;" in summary
    assert list(tmp_path.glob("lithi-gpu-*")) == [], "the staged bundle is removed"
