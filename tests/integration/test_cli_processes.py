"""``lithi-bundle`` as a process of its own: ``python -m``, a strict-ASCII terminal, a real full
or read-only disk (a tmpfs mounted in a user namespace)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.bundle import format as fmt
from tests.helpers.bundles import make_input
from tests.helpers.timing import limit


@pytest.fixture
def bundle(tmp_path):
    make_input(tmp_path / "b", n=30, rows_per_part=10)
    return tmp_path / "b"


def test_python_dash_m_entry_point(bundle):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    ok = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "verify", "--json", str(bundle)],
        capture_output=True,
        text=True,
        env=env,
        timeout=limit(60),
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["valid"] is True
    (bundle / fmt.part_path(0)).write_bytes(b"garbage")
    bad = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "verify", str(bundle)],
        capture_output=True,
        text=True,
        env=env,
        timeout=limit(60),
    )
    assert bad.returncode == 1 and "SizeMismatch" in bad.stdout


def test_a_strict_ascii_terminal_gets_escapes_not_a_traceback(bundle):
    os.close(os.open(os.fsencode(bundle) + b"/\xff-\xc3\xa9", os.O_CREAT | os.O_WRONLY))
    env = {**os.environ, "PYTHONIOENCODING": "ascii:strict"}
    runs = {
        cmd: subprocess.run(
            [sys.executable, "-m", "pipeline.cli", cmd, str(bundle)],
            capture_output=True,
            text=True,
            env=env,
            timeout=limit(60),
        )
        for cmd in ("verify", "inspect")
    }
    assert [r.returncode for r in runs.values()] == [1, 0]
    assert not any("Traceback" in r.stderr for r in runs.values())
    # the byte that is not UTF-8 named as \xff, the e-acute that ASCII cannot show as \xe9
    assert "\\xff-\\xe9: file not bound" in runs["verify"].stdout


def _can_unshare() -> bool:
    """Whether this machine lets an unprivileged process mount a small tmpfs of its own."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
        capture_output=True,
        timeout=limit(30),
    )
    return probe.returncode == 0


@pytest.mark.parametrize(
    ("options", "reason"),
    [("size=256k", "No space left on device"), ("ro", "Read-only file system")],
)
def test_stage_on_a_full_or_read_only_disk_exits_1_leaving_nothing(tmp_path, options, reason):
    if not _can_unshare():
        pytest.skip("needs `unshare -rm` (user and mount namespaces) to mount a real small tmpfs")
    rng = np.random.default_rng(0)
    n = 100_000
    table = tmp_path / "t.parquet"
    ids = pa.array([f"item-{i:06d}" for i in range(n)])
    pq.write_table(pa.table({"id": ids, "x": rng.random(n)}), table)  # ~1 MB of floats
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    stage_cmd = " ".join(
        shlex.quote(a)
        for a in [sys.executable, "-m", "pipeline.cli", "stage", str(table), "--id-field", "id"]
        + ["--kind", "input", "--out", f"{mnt}/new/b", "--rows-per-part", "10000"]
    )
    script = (
        f"mount -t tmpfs -o {options} none {shlex.quote(str(mnt))} || exit 99; "
        f"{stage_cmd}; rc=$?; echo LISTING; ls -A {shlex.quote(str(mnt))}; exit $rc"
    )
    run = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=limit(120)
    )
    assert run.returncode == 1, run.stderr
    assert run.stderr.count("\n") == 1 and reason in run.stderr, run.stderr
    assert f"{mnt}/new" in run.stderr and "Traceback" not in run.stderr
    assert run.stdout.split("LISTING")[1].strip() == ""  # nothing left behind
