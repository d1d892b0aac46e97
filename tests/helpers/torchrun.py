"""A real torchrun of N ranks on this machine, as the integration tests start one: rendezvous on
a free port of 127.0.0.1, one intra-op thread a rank, the repository importable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.ports import free_port
from tests.helpers.timing import limit

ROOT = Path(__file__).resolve().parents[2]


def run_torchrun(
    ranks: int, *target: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``target`` (a script and its arguments, or ``-m module ...``) under torchrun with
    ``ranks`` ranks from the repository root, ``env`` over this environment; wait at most
    ``timeout`` seconds (scaled by the run's time factor) and return what it did."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *target,
    ]  # fmt: skip
    full = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=limit(timeout)
    )
