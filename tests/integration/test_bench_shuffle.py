"""bench/shuffle.py measures what it says on a small label-sorted bundle: without mixing a rank
of several sees a slice of the labels and an iterable batch one part; with it every rank sees
every label and a batch several parts (its rates are figures, never asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.timing import limit

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_reports_the_skew_mixing_removes(tmp_path):
    out = subprocess.run(
        [sys.executable, "bench/shuffle.py", "--rows", "20480", "--worlds", "1,2", "--rounds", "1",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=limit(300),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {}
    for line in out.stdout.splitlines():
        m = re.match(r"(\S+(?: \S+)?)\s+(\d) +([\d.]+) +(\d) of 8 +([\d.]+) +([\d.]+)", line)
        if m:
            rows[m[1], int(m[2])] = (float(m[3]), int(m[4]), float(m[5]), float(m[6]))
    assert rows["iterable", 2][1] == 4 and rows["map", 2][1] == 4  # half the labels per rank
    assert rows["iterable mix", 2][1] == 8 and rows["map mix", 2][1] == 8
    assert rows["torch DistributedSampler", 2][1] == 8
    assert rows["iterable", 1][3] == 1.0  # every iterable batch from one part (2,560 rows each)
    assert rows["iterable mix", 1][2] > 1 and rows["iterable mix", 2][3] == 0.0
    assert abs(rows["torch RandomSampler", 1][0] - 1 / 8) < 0.02  # same-part pairs, uniform
    assert abs(rows["map mix", 2][0] - 1 / 8) < 0.02
