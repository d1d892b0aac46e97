"""SIGKILL a staging process at random points: never a half bundle, never a lying manifest."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline.bundle import format as fmt
from pipeline.bundle.verify import verify

KILLS = 36
ROWS = 300_000  # ~9 MB of incompressible floats in 12 parts: each part is written and fsynced

CHILD = """
import sys, time
import numpy as np
import pyarrow as pa
from pipeline.bundle.stage import stage

dest, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(7)
table = pa.table({
    "id": pa.array(np.arange(n)).cast(pa.string()),
    "a": rng.random(n),
    "b": rng.random(n).astype("float32"),
    "c": rng.integers(0, 2**62, n),
})
print("ready", flush=True)
t0 = time.perf_counter()
stage(table, dest, id_field="id", kind="input", rows_per_part=n // 12)
print("done", time.perf_counter() - t0, flush=True)
"""


def _start(dest: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(dest), str(ROWS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # data is built: from here on every instant is staging
    assert line.strip() == "ready", line
    return proc


def _manifest_dirs(parent: Path) -> list[Path]:
    return [Path(d) for d, _, files in os.walk(parent) if fmt.MANIFEST_NAME in files]


def _state(parent: Path, dest: Path) -> str:
    """Where the kill landed, as seen on disk afterwards."""
    if dest.exists():
        return "published"
    staging = [p for p in parent.iterdir() if p.name.startswith(f".{dest.name}.staging-")]
    if not staging:
        return "nothing yet"
    if any((p / fmt.MANIFEST_NAME).exists() for p in staging):
        return "staged, not yet renamed"
    return "parts only"


@pytest.mark.integration
def test_sigkill_at_random_points_never_leaves_a_bad_bundle(tmp_path):
    # One uninterrupted run: the bundle verifies and gives the span kills are spread over.
    calib = tmp_path / "calibration"
    calib.mkdir()
    proc = _start(calib / "bundle")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    span = float(out.split()[-1])
    assert len(verify(calib / "bundle").manifest.parts) == 12

    rng = random.Random(20260905)
    seen: Counter[str] = Counter()
    for i in range(KILLS):
        parent = tmp_path / f"run{i:02d}"
        parent.mkdir()
        dest = parent / "bundle"
        proc = _start(dest)
        time.sleep(rng.uniform(0, span * 1.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        seen[_state(parent, dest)] += 1
        # The final name is all or nothing.
        if dest.exists():
            verify(dest)
        # Any directory with a manifest (the hidden staging one included) is complete.
        for d in _manifest_dirs(parent):
            verify(d)
    print(f"kills by stage reached: {dict(seen)}")
    # The kills really landed mid-staging (otherwise this test proves nothing).
    assert seen["parts only"] >= 1, seen
