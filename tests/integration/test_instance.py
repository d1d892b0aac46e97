"""Instance setup that cannot break: a fresh DAGSTER_HOME is created once, with the project's yaml.

Reproduced first: six processes opening a new SQLite instance at once leave ``alembic_version``
with two heads in most rounds, and the instance then fails on every open. Six processes
running the project's entry-point step at once, on fresh homes, must leave it healthy every time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from pipeline.defs.instance import PROJECT_YAML, prepare_instance
from tests.helpers.at_once import run_at_once
from tests.helpers.timing import limit


def test_a_home_without_dagster_yaml_gets_the_projects(tmp_path):
    home = prepare_instance(tmp_path / "home")
    config = yaml.safe_load((home / "dagster.yaml").read_text())
    assert config == yaml.safe_load(PROJECT_YAML.read_text())
    assert config["telemetry"]["enabled"] is False
    assert config["run_monitoring"]["enabled"] is True and config["run_retries"]["enabled"] is True
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_runs() == []


def test_a_home_with_its_own_dagster_yaml_keeps_it(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    prepare_instance(home)
    assert (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_entry_points_on_a_fresh_home_leave_it_healthy(tmp_path, round_):
    home = tmp_path / "home"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    procs = run_at_once([sys.executable, "-m", "pipeline.defs.instance"], 6, env=env, timeout=300)
    assert [p.returncode for p in procs] == [0] * 6, [(p.stdout, p.stderr) for p in procs]
    opened = subprocess.run(
        [sys.executable, "-c", "import dagster as dg; dg.DagsterInstance.get().get_runs()"],
        env=env, capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr[-2000:]
    assert Path(home / "dagster.yaml").exists()


BAD = {"LITHI_JOB_ID": "../x", "LITHI_WORLD_SIZE": "0", "LITHI_TRAINER_CONFIG": "{"}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_setting_stops_every_entry_point_with_its_one_line(tmp_path, name):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"), name: BAD[name]}
    daemon = "python -m pipeline.defs.instance && dagster-daemon run -w workspace.yaml"
    commands = {  # the README's commands, and Dagster's own loader of the location
        "instance and daemon": ["bash", "-c", daemon.replace("python", sys.executable, 1)],
        "validate": [str(Path(sys.executable).with_name("dagster")), "definitions", "validate",
                     "-m", "pipeline.defs.definitions"],
        "demo": [sys.executable, "-m", "pipeline.defs.demo"],
    }  # fmt: skip
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    for what, argv in commands.items():
        out = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=limit(180),
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
        assert out.returncode != 0, (what, out.stdout[-2000:])
        said = [line for line in out.stderr.splitlines() if name in line]
        assert len(said) == 1, (what, out.stderr[-3000:])
        assert "Traceback" not in out.stderr and "Stack Trace" not in out.stderr, what
        assert "dagster.daemon" not in out.stderr + out.stdout, what  # nothing was started
