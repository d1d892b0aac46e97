"""The wrapper every ``torchrun`` launch goes through starts in a blink: it imports no torch,
pyarrow or Dagster before it hands its process over to the command (``exec``)."""

from __future__ import annotations

import subprocess
import sys

from pipeline.tethered import tethered
from tests.helpers.timing import limit


def test_the_tether_imports_nothing_heavy_before_it_execs_the_command():
    command = tethered(["true"])
    module = command[command.index("-m") + 1]
    probe = (
        f"import importlib, sys; importlib.import_module({module!r}); "
        "print(sorted(m for m in ('torch', 'pyarrow', 'dagster', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=limit(120),
    )
    assert out.stdout.strip() == "[]", (module, out.stdout, out.stderr[-2000:])


def test_the_tethered_command_runs_and_its_status_comes_back():
    ran = subprocess.run(
        tethered([sys.executable, "-c", "raise SystemExit(3)"]), timeout=limit(120)
    )
    assert ran.returncode == 3
