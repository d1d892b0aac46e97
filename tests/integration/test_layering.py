"""The contracts that enforce the README's layering can fail: one copied tree, five violations.

``make lint`` runs ``lint-imports`` on the tree itself (every contract kept). Here a copy of the
tree gets one deliberate violation per contract, and one ``lint-imports`` run must list, under each
of those contracts, the very line that breaks it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.timing import limit

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

#: (module, the import appended to it, words in the name of the contract it breaks)
VIOLATIONS = [
    ("pipeline/bundle/format.py", "import torch", "checking a bundle needs no torch"),
    ("pipeline/readers/split.py", "import dagster", "imports no Dagster"),
    ("pipeline/training/record.py", "import resources.settings", "imports no Dagster"),
    ("pipeline/readers/index.py", "import pipeline.training", "layers"),
    ("resources/credentials.py", "import assets", "layers"),
]


def _broken_sections(report: str) -> dict[str, str]:
    """Each broken contract's heading -> the imports the report lists under it."""
    broken = report.partition("Broken contracts")[2]
    heads = list(re.finditer(r"^(.+)\n-{3,}\n", broken, re.M))
    ends = [h.start() for h in heads[1:]] + [len(broken)]
    return {h.group(1).strip(): broken[h.end() : end] for h, end in zip(heads, ends, strict=True)}


def test_each_deliberate_violation_breaks_its_contract(tmp_path):
    for name in ("pipeline", "assets", "resources"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    expected = []
    for module, line, contract in VIOLATIONS:
        target = tmp_path / module
        text = target.read_text() + f"\n{line}  # deliberate violation\n"
        target.write_text(text)
        number = text.splitlines().index(f"{line}  # deliberate violation") + 1
        importer = module.removesuffix(".py").replace("/", ".")
        expected.append((contract, f"{importer} -> {line.split()[1]} (l.{number})"))

    out = subprocess.run(
        [str(LINT), "--config", str(tmp_path / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=limit(300),
    )
    assert out.returncode != 0, out.stdout
    sections = _broken_sections(out.stdout)
    for contract, edge in expected:
        (section,) = [text for head, text in sections.items() if contract in head]
        # the contract is broken by this very line, not only by another violation's chain
        assert edge in section, (contract, edge, out.stdout)
