"""The layering the README promises holds, and the contract that says so can fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy_tree(dest: Path) -> Path:
    for name in ("pipeline", "assets", "resources"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_tree_keeps_every_contract():
    out = _lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("pipeline/bundle/format.py", "import torch", "checking a bundle needs no torch"),
        ("pipeline/readers/split.py", "import dagster", "imports no Dagster"),
        ("pipeline/training/record.py", "import resources.settings", "imports no Dagster"),
        ("pipeline/readers/index.py", "import pipeline.training", "layers"),
        ("resources/credentials.py", "import assets", "layers"),
    ],
)
def test_a_deliberate_violation_breaks_its_contract(tmp_path, module, line, contract):
    root = _copy_tree(tmp_path)
    target = root / module
    target.write_text(target.read_text() + f"\n{line}  # deliberate violation\n")
    out = _lint(root)
    assert out.returncode != 0, out.stdout
    verdicts = [
        ln for ln in out.stdout.splitlines() if contract in ln and ln.endswith(("KEPT", "BROKEN"))
    ]
    assert verdicts and all(v.endswith("BROKEN") for v in verdicts), out.stdout
