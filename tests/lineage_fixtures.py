"""A persisted Dagster instance holding one finished chain run, shared by the lineage tests.

Use it with ``pytest_plugins = ["tests.lineage_fixtures"]`` so the session-scoped fixture is
registered once and the GraphQL and browser tests read the same instance (the chain is trained
only once per session).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import CHAIN_JOB_NAME, chain_run_config
from resources.compute.local import LocalCompute
from resources.settings import REPO_ROOT
from tests.chain_fixtures import FAST_TRAINING, chain_resources, sample_job

DAGSTER_YAML = """\
# A throwaway instance for the lineage tests: SQLite storage in this folder, no telemetry, and
# no "join the community" dialog over the UI the browser test looks at.
telemetry:
  enabled: false
nux:
  enabled: false
"""


@dataclass(frozen=True)
class LineageInstance:
    """Where the finished chain run lives and what it was built from."""

    dagster_home: Path
    lithi_home: Path
    job_id: str
    version_id: str
    run_id: str
    workspace: Path

    def env(self) -> dict[str, str]:
        """Environment for a process (webserver, CLI) that should see this instance."""
        return {
            **os.environ,
            "DAGSTER_HOME": str(self.dagster_home),
            "LITHI_HOME": str(self.lithi_home),
            "LITHI_JOB_ID": self.job_id,
        }

    def instance(self) -> dg.DagsterInstance:
        """Open the persisted instance (the caller disposes of it)."""
        return dg.DagsterInstance.from_config(str(self.dagster_home))


def write_workspace(path: Path) -> Path:
    """A workspace file loading ``pipeline.defs.definitions`` with the repo root as working dir."""
    path.write_text(
        "load_from:\n"
        "  - python_module:\n"
        "      module_name: pipeline.defs.definitions\n"
        "      location_name: lithi-train\n"
        f"      working_directory: {REPO_ROOT}\n"
    )
    return path


def build_lineage_instance(root: Path, sample: str = "digits") -> LineageInstance:
    """Stage ``sample``, label it with the local Compute, and run the chain job into a new home."""
    dagster_home = root / "dagster_home"
    lithi_home = root / "lithi"
    dagster_home.mkdir(parents=True)
    lithi_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)

    job_id = sample_job(lithi_home, sample)
    # The labelling job runs in a detached worker: wait (bounded) for its result version.
    status = LocalCompute(lithi_home / "compute").wait(job_id, timeout=120)
    version_id = status.latest_version_id
    assert version_id, (
        f"Compute job {job_id} ended {status.state} without a result: {status.message}"
    )

    run_config = chain_run_config(job_id, version_id)
    run_config["ops"].update(FAST_TRAINING["ops"])
    # The tags the sensor puts on a rebuild from a newer manifest (pipeline.defs.sensor._tags).
    tags = {
        "lithi/job_id": job_id,
        "lithi/version_id": version_id,
        "lithi/attempt": "1",
        "lithi/trigger": "newer_manifest",
        "lithi/allow_partial": "false",
    }
    defs = build_definitions(**chain_resources(lithi_home, job_id))
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(
            run_config=run_config, instance=instance, tags=tags
        )
    assert result.success, f"the chain run {result.run_id} failed; nothing to inspect"
    workspace = write_workspace(root / "workspace.yaml")
    return LineageInstance(dagster_home, lithi_home, job_id, version_id, result.run_id, workspace)


@pytest.fixture(scope="session")
def lineage_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LineageInstance]:
    """One finished digits chain run in a persisted SQLite instance, built once per session."""
    yield build_lineage_instance(tmp_path_factory.mktemp("lineage"))
