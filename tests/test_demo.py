"""The README's main command, as a subprocess: PARTIAL first, daemon + sensor, summary, exit 0."""

import os
import shutil
import subprocess
import sys

import pytest

from resources.settings import REPO_ROOT


@pytest.mark.integration
def test_demo_ends_with_a_reconciled_summary_and_exit_0(tmp_path):
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    shutil.copy(REPO_ROOT / "dagster_home" / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        "LITHI_HOME": str(tmp_path / "lithi"),
        "LITHI_NUM_WORKERS": "0",
    }
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.defs.demo", "--sample", "wine", "--world-size", "2",
         "--timeout", "240"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "PARTIAL" in text and "SUCCEEDED attempt 2" in text
    assert "resubmitted outstanding items of: wine-" in text
    assert "reconciled: True  iterated 178 of 178" in text
    assert "output bundle: prediction-" in text
    assert "accuracy vs true labels" in text
