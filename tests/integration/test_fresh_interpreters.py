"""What only a fresh interpreter shows: the README's reader snippet runs as written with only
pyarrow, torch, numpy and pydantic (no Dagster imported); the holdout split is the same whatever
the process's string hash seed; a bad setting stops the code location from loading, with its
one line naming the variable and no traceback (tests/resources/test_settings.py checks the same
refusals in-process).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pyarrow as pa

from pipeline.bundle.stage import stage
from resources.settings import REPO_ROOT
from tests.helpers.timing import limit


def test_the_code_location_refuses_to_load_with_the_variable_named(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITHI_")}
    env |= {"LITHI_MAX_ATTEMPTS": "abc", "LITHI_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", "import pipeline.defs.definitions"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == "lithi-train: LITHI_MAX_ATTEMPTS='abc': expected a whole number"
    assert "Traceback" not in out.stderr  # the user's mistake, not a bug: its one line only


def test_holdout_is_the_same_in_every_process():
    """Python's str hash is salted per process; a split built on it would differ by rank."""
    code = (
        "from pipeline.training.features import holdout_mask;"
        "print(''.join('1' if b else '0' for b in holdout_mask([f'i{n}' for n in range(300)], 20)))"
    )
    masks = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=limit(120),
        ).stdout
        for seed in ("1", "2")
    }
    assert len(masks) == 1 and "1" in masks.pop()


def test_readme_reader_snippet_runs_without_dagster(tmp_path):
    text = (REPO_ROOT / "README.md").read_text()
    (snippet,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    bundle = tmp_path / "bundle"
    stage(
        pa.table(
            {"item_id": [f"{i:04d}" for i in range(100)], "x": [float(i) for i in range(100)]}
        ),
        bundle,
        id_field="item_id",
        kind="input",
        rows_per_part=30,
    )
    program = (
        "import sys\n"
        "class _NoDagster:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('dagster', 'dagster_pipes', 'assets', 'resources'):\n"
        "            raise ImportError(f'the reader core imported {name}')\n"
        "sys.meta_path.insert(0, _NoDagster())\n"
        + snippet.replace("path/to/bundle", str(bundle))
        + "ids = [i for batch in loader for i in batch['item_id']]\n"
        "assert sorted(ids) == [f'{i:04d}' for i in range(100)], ids\n"
        "print('ok', len(ids))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=limit(120),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok 100"
