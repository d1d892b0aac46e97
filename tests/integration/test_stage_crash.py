"""SIGKILL a staging process at random points: never a half bundle, never a lying manifest."""

from __future__ import annotations

import os
import random
import signal
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.bundle import format as fmt
from pipeline.bundle.stage import stage
from pipeline.bundle.verify import verify
from tests.helpers.timing import limit, wait_until

KILLS = 36
ROWS = 300_000  # ~9 MB of incompressible floats in 12 parts: each part is written and fsynced


@pytest.fixture(scope="module")
def table() -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table(
        {
            "id": pa.array(np.arange(ROWS)).cast(pa.string()),
            "a": rng.random(ROWS),
            "b": rng.random(ROWS).astype("float32"),
            "c": rng.integers(0, 2**62, ROWS),
        }
    )


class Stager:
    """A process of its own, forked from the test's with the table already built, staging it
    into ``dest``; the test kills it, or reads how long staging took."""

    def __init__(self, table: pa.Table, dest: Path) -> None:
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: stage, say how long it took, out without any cleanup
            code = 1
            try:
                os.close(read)
                t0 = time.perf_counter()
                stage(table, dest, id_field="id", kind="input", rows_per_part=ROWS // 12)
                os.write(write, f"done {time.perf_counter() - t0}\n".encode())
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write)
        self.out = os.fdopen(read)

    def wait(self) -> int:
        """The child's exit code, or minus the signal that ended it."""

        def ended() -> tuple[int] | None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            return (os.waitstatus_to_exitcode(status),) if done else None

        (code,) = wait_until(ended, timeout=limit(60), what=f"the end of pid {self.pid}")
        self.out.close()
        return code


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


@pytest.mark.durable
def test_sigkill_at_random_points_never_leaves_a_bad_bundle(tmp_path, table):
    # One uninterrupted run: the bundle verifies and gives the span kills are spread over.
    calib = tmp_path / "calibration"
    calib.mkdir()
    stager = Stager(table, calib / "bundle")
    out = stager.out.read()
    assert stager.wait() == 0
    span = float(out.split()[-1])
    assert len(verify(calib / "bundle").manifest.parts) == 12

    rng = random.Random(20260905)
    seen: Counter[str] = Counter()
    for i in range(KILLS):
        parent = tmp_path / f"run{i:02d}"
        parent.mkdir()
        dest = parent / "bundle"
        stager = Stager(table, dest)  # from here on every instant is staging
        time.sleep(rng.uniform(0, span * 1.25))  # where the kill lands, not a wait
        os.kill(stager.pid, signal.SIGKILL)
        assert stager.wait() in (-signal.SIGKILL, 0)  # 0: it was done before the kill
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
    # The next staging into the same place sweeps what the killed ones left.
    for i in range(KILLS):
        parent = tmp_path / f"run{i:02d}"
        stage(table.slice(0, 10), parent / "again", id_field="id", kind="input")
        assert sorted(p.name for p in parent.iterdir()) in (["again"], ["again", "bundle"])
