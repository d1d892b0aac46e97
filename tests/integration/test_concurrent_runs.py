"""Two chain runs at once, on one instance and one bundle cache: both succeed, nothing mixed up.

The schedule firing while a sensor run trains the same version is the realistic way to get
here. Run on the project's SQLite instance and on a PostgreSQL-backed one (deploy/dagster.yaml;
skipped, loudly, without a server).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from pipeline.bundle.verify import verify
from pipeline.defs.instance import PROJECT_YAML, prepare_instance
from resources.compute.local import LocalCompute
from tests.helpers.at_once import run_at_once
from tests.helpers.postgres import fresh_database, postgres_home

RUN_CHAIN = """
import json, sys
import dagster as dg
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import CHAIN_JOB_NAME, chain_run_config
from resources.settings import LithiEnv
job, version = sys.argv[1], sys.argv[2]
defs = build_definitions(LithiEnv())
config = chain_run_config(job, version)
with dg.DagsterInstance.get() as instance:
    tags = {"lithi/job_id": job, "lithi/version_id": version}
    result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(
        run_config=config, instance=instance, tags=tags
    )
out = result.asset_materializations_for_node("output_bundle")[0].metadata
print(json.dumps({"run": result.run_id, "ok": result.success, "bundle": out["bundle_path"].value}))
"""


@pytest.fixture(params=["sqlite", "postgres"])
def instance_env(request, tmp_path, monkeypatch) -> Iterator[dict[str, str]]:
    """A prepared Dagster home, SQLite or PostgreSQL-backed, and the env that opens it."""
    dagster_home = tmp_path / "dagster_home"
    with contextlib.ExitStack() as stack:
        if request.param == "postgres":
            url = stack.enter_context(fresh_database())
            env = postgres_home(dagster_home, url)
            monkeypatch.setenv(
                "DAGSTER_POSTGRES_URL", env["DAGSTER_POSTGRES_URL"]
            )  # this process opens it too
        else:
            dagster_home.mkdir()
            shutil.copy(PROJECT_YAML, dagster_home)
            env = {"DAGSTER_HOME": str(dagster_home)}
        with monkeypatch.context() as m:
            m.setenv("DAGSTER_HOME", str(dagster_home))
            prepare_instance(dagster_home)
        yield env


def test_two_chain_runs_of_one_version_at_once(tmp_path, labelled_samples, instance_env):
    job = labelled_samples.jobs["wine"]
    version = LocalCompute(labelled_samples.compute_root).status(job).latest_version_id
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITHI_")}
    env |= instance_env | {
        "LITHI_HOME": str(tmp_path / "home"),
        "LITHI_COMPUTE_ROOT": str(labelled_samples.compute_root),
        "LITHI_COMPUTE_EXECUTOR": "inline",
        "LITHI_NUM_WORKERS": "0",
        "LITHI_TRAINER_CONFIG": '{"auto_features": true, "epochs": 2}',
    }
    procs = run_at_once([sys.executable, "-c", RUN_CHAIN, job, version], 2, env=env, timeout=480)
    assert [p.returncode for p in procs] == [0, 0], [p.stderr[-2000:] for p in procs]
    results = [json.loads(p.stdout.strip().splitlines()[-1]) for p in procs]
    assert all(r["ok"] for r in results) and results[0]["run"] != results[1]["run"]
    with dg.DagsterInstance.from_config(instance_env["DAGSTER_HOME"]) as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"lithi/version_id": version}))
        assert sorted(r.run_id for r in runs) == sorted(r["run"] for r in results)
        assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
    for r in results:  # each run published a bundle that verifies, from the same snapshot
        assert verify(Path(r["bundle"])).manifest.input.version_id == version
