"""Create and migrate the Dagster instance once, before anything else opens it.

Two processes opening a brand-new SQLite instance at the same moment (the daemon and the
webserver, say) can both create its schema and leave ``alembic_version`` with two heads — an
instance that then fails on every open, for good. Every entry point (``make demo``, ``make ui``,
the daemon command in the README) calls :func:`prepare_instance` first: under a file lock, it
gives a ``DAGSTER_HOME`` without a ``dagster.yaml`` the project's (telemetry off, run monitoring
and run retries on), then opens the instance once, which creates or migrates its storage, and
marks failed the runs a killed process left "started" (:func:`fail_orphaned_runs`).

    python -m pipeline.defs.instance          # prepares $DAGSTER_HOME
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path

import dagster as dg
import filelock

from pipeline.bundle.leftovers import pid_alive

#: The instance config a new DAGSTER_HOME gets; shipped inside the package, so an installed
#: package prepares an instance as a checkout does.
PROJECT_YAML = Path(__file__).with_name("dagster.yaml")
LOCK_NAME = ".instance.lock"


def prepare_instance(home: str | os.PathLike[str] | None = None) -> Path:
    """Make ``home`` (default ``$DAGSTER_HOME``) a ready instance; return its path."""
    if home is None:
        home = os.environ.get("DAGSTER_HOME")
        if not home:
            raise ValueError("DAGSTER_HOME is not set: name the Dagster instance's folder")
    path = Path(home).resolve()
    path.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(path / LOCK_NAME, timeout=300):
        config = path / "dagster.yaml"
        if not config.exists():
            shutil.copyfile(PROJECT_YAML, config)
        with dg.DagsterInstance.from_config(str(path)) as instance:
            instance.get_runs(limit=1)  # the first open creates or migrates every storage
            fail_orphaned_runs(instance)
    return path


def fail_orphaned_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed the runs still "started" whose process is gone; return their ids.

    A run started from the command line (``dagster asset materialize``, a script) and killed
    never reports its end, and nothing else would: no run launcher watches it. Its process is
    the one that recorded the run's start; when no such process runs on this machine any more,
    the run is marked failed, saying so. Only an instance stored on this machine (SQLite) is
    judged: a pid means nothing to an instance that other machines share (PostgreSQL), whose
    launched runs Dagster's run monitoring watches.
    """
    if "sqlite" not in type(instance.run_storage).__name__.lower():
        return []
    statuses = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
    failed = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=statuses)):
        starts = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_START)
        pids = {e.dagster_event.pid for e in starts if e.dagster_event is not None}
        if not pids or None in pids or any(pid_alive(p) for p in pids if p is not None):
            continue  # not started by a process, or that process still runs
        instance.report_run_failed(
            run,
            f"the process that ran it (pid {', '.join(map(str, sorted(pids)))}) is gone, killed "
            "before the run could end: marked failed when the instance was next opened",
        )
        failed.append(run.run_id)
    return failed


def check_settings() -> None:
    """Load the code location as the daemon and the webserver will (every ``LITHI_*``
    variable, the trainer and its config): a bad setting exits here with its one line
    (:mod:`pipeline.defs.definitions`), before anything is started."""
    importlib.import_module("pipeline.defs.definitions")  # imports torch and the chain


def main() -> int:
    """Prepare ``$DAGSTER_HOME`` and check the settings; one line on success, one line and exit 1
    on failure, so ``python -m pipeline.defs.instance && dagster-daemon run ...`` starts nothing
    with a bad ``LITHI_*`` value."""
    try:
        path = prepare_instance()
        check_settings()
    except (ValueError, OSError, filelock.Timeout) as e:
        print(f"pipeline.defs.instance: {e}", file=sys.stderr)
        return 1
    print(f"Dagster instance ready: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
