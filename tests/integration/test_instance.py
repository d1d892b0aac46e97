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
from tests.helpers.timing import limit, wait_until


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


#: The entry points' first step without its settings check (which loads the code location and
#: runs after the instance is ready): the racing part, six at once.
PREPARE = "from pipeline.defs.instance import prepare_instance; prepare_instance()"


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_entry_points_on_a_fresh_home_leave_it_healthy(tmp_path, round_):
    home = tmp_path / "home"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    procs = run_at_once([sys.executable, "-c", PREPARE], 6, env=env, timeout=300)
    assert [p.returncode for p in procs] == [0] * 6, [(p.stdout, p.stderr) for p in procs]
    opened = subprocess.run(
        [sys.executable, "-c", "import dagster as dg; dg.DagsterInstance.get().get_runs()"],
        env=env, capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr[-2000:]
    assert Path(home / "dagster.yaml").exists()


def test_a_bad_setting_stops_every_entry_point_with_its_one_line(tmp_path):
    # one variable through every entry point; every variable's one line is checked in-process
    # (tests/resources/test_settings.py) and through a fresh interpreter (test_fresh_interpreters)
    name = "LITHI_JOB_ID"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"), name: "../x"}
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


SLOW_RUN = """
import time
import dagster as dg

@dg.asset
def slow() -> None:
    time.sleep(600)

dg.materialize([slow], instance=dg.DagsterInstance.get())
"""


def _started_run(env: dict, home: Path) -> tuple[subprocess.Popen, str]:
    """A run of a slow asset started from a script, as the command line starts one."""
    child = subprocess.Popen([sys.executable, "-c", SLOW_RUN], env=env)

    def started() -> str | None:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            runs = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
            mine = [r.run_id for r in runs if r.run_id not in seen]
        return mine[0] if mine else None

    seen = _run_ids(home)
    return child, wait_until(started, timeout=limit(120), what="the run's start")


def _run_ids(home: Path) -> set[str]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return {r.run_id for r in instance.get_runs()}


def _status(home: Path, run_id: str) -> dg.DagsterRunStatus:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        return run.status


def test_a_killed_command_line_run_is_marked_failed_when_the_instance_is_next_opened(tmp_path):
    home = prepare_instance(tmp_path / "home")
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    killed, killed_id = _started_run(env, home)
    alive, alive_id = _started_run(env, home)
    try:
        killed.kill()
        killed.wait()
        assert _status(home, killed_id) == dg.DagsterRunStatus.STARTED  # nothing else notices
        prepare_instance(home)  # what every entry point does first
        assert _status(home, killed_id) == dg.DagsterRunStatus.FAILURE
        assert _status(home, alive_id) == dg.DagsterRunStatus.STARTED  # its process still runs
        with dg.DagsterInstance.from_config(str(home)) as instance:
            failure = instance.all_logs(killed_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert "is gone, killed before the run could end" in failure[-1].message
    finally:
        alive.kill()
        alive.wait()
