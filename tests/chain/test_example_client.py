"""The example Compute client of your own (``examples/folder_compute.py``), selected by import path
as a user selects it, through the sensor and the chain's first link.

A Compute service publishes a job's result versions as bundle folders under one root; the client
only follows them. The sensor requests the chain for a complete version and ``result_manifest``
reads it; a newer PARTIAL version is not resubmitted (the client defines no ``resubmit``), and the
skip reason says so in one line; a resubmission run started by hand fails in one line too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.result_manifest import ResultManifestConfig, result_manifest
from examples import folder_compute
from pipeline.bundle.manifest import JobInfo
from pipeline.bundle.stage import stage
from pipeline.bundle.verify import verify
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import RESUBMIT_JOB_NAME, resubmit_run_config
from pipeline.defs.sensor import SENSOR_NAME
from resources.compute.local import LocalCompute
from resources.settings import LithiEnv
from tests.helpers.chain import observations

CLIENT = "examples.folder_compute:FolderCompute"
FOLLOWS = "it only follows jobs"
NO_RESUBMIT = f"nothing can resubmit them: Compute client {CLIENT} defines no resubmit"


@pytest.fixture
def published(tmp_path, labelled_samples, monkeypatch) -> Path:
    """The wine job's result, published by "the service" as ``<root>/<job>/first``."""
    job = labelled_samples.jobs["wine"]
    src = LocalCompute(labelled_samples.compute_root).manifest_url(job)
    root = tmp_path / "published"
    shutil.copytree(src, root / job / "first")
    monkeypatch.setenv(folder_compute.ROOT, str(root))
    return root / job / "first"


def _partial_version(v1: Path, name: str) -> Path:
    """A second version beside ``v1``: attempt 2, naming it as parent, 3 items outstanding."""
    snap = verify(v1)
    table = pa.concat_tables([pq.read_table(p) for p in snap.part_paths()])
    id_field = snap.manifest.item_id_field
    return stage(
        table.slice(3),
        v1.parent / name,
        id_field=id_field,
        kind="result",
        job=JobInfo(
            job_id=v1.parent.name,
            status="PARTIAL",
            attempt=2,
            parent_version_id=snap.identity.version_id,
        ),
        input=snap.manifest.input,
        outstanding_ids=table.column(id_field).slice(0, 3),
    ).root


def _tick(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None = None):
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=defs, resources=defs.resources
    ) as ctx:
        return sensor.evaluate_tick(ctx)


def _defs(tmp_path: Path, job: str) -> dg.Definitions:
    return build_definitions(LithiEnv(home=tmp_path / "home", compute=CLIENT, job_id=job))


def test_the_sensor_follows_the_example_client_and_the_chain_reads_its_version(tmp_path, published):
    job, v1 = published.parent.name, verify(published).identity.version_id
    defs = _defs(tmp_path, job)
    with dg.instance_for_test() as instance:
        first = _tick(defs, instance)
        (published.parent / "half-written").mkdir()  # parts only, no manifest: not published
        (published.parent / ".second.staging").mkdir()  # hidden: still being staged
        quiet = _tick(defs, instance, first.cursor)
    (request,) = first.run_requests
    assert request.run_key == f"chain:{job}:{v1}"
    assert [e.metadata["version_id"].value for e in observations(first)] == [v1]
    assert quiet.run_requests == [] and "already requested" in quiet.skip_message
    res = defs.resources
    check, output = result_manifest(
        dg.build_asset_context(),
        config=ResultManifestConfig(**request.run_config["ops"]["result_manifest"]["config"]),
        compute=res["compute"],
        bundle_store=res["bundle_store"],
        chain_settings=res["chain_settings"],
    )
    assert check.passed
    assert output.metadata["manifest_url"].value == str(published)
    assert output.value.manifest.snapshot.version_id == v1


def test_a_partial_version_is_not_resubmitted_and_the_tick_says_why(tmp_path, published):
    job = published.parent.name
    defs = _defs(tmp_path, job)
    with dg.instance_for_test() as instance:
        first = _tick(defs, instance)
        v2 = verify(_partial_version(published, "second")).identity.version_id
        second = _tick(defs, instance, first.cursor)
        # A resubmission run asked for by hand (the Launchpad) is refused by the client.
        by_hand = defs.resolve_job_def(RESUBMIT_JOB_NAME).execute_in_process(
            run_config=resubmit_run_config(job, v2), instance=instance, raise_on_error=False
        )
    assert second.run_requests == []
    assert [e.metadata["version_id"].value for e in observations(second)] == [v2]
    reason = second.skip_message
    assert "\n" not in reason and NO_RESUBMIT in reason
    assert f"{job}: PARTIAL with 3 items outstanding" in reason
    assert "train_on_partial is off" in reason
    assert not by_hand.success
    (failure,) = [e for e in by_hand.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = failure.step_failure_data.user_failure_data.description
    assert message == f"NotSupported: Compute client {CLIENT}: defines no resubmit; {FOLLOWS}"


def test_a_job_with_nothing_published_yet_is_running(tmp_path, monkeypatch):
    monkeypatch.setenv(folder_compute.ROOT, str(tmp_path))
    (tmp_path / "job-1").mkdir()
    client = folder_compute.FolderCompute()
    status = client.status("job-1")
    assert (status.state, status.versions, status.latest_version_id) == ("RUNNING", [], None)
    defs = _defs(tmp_path, "job-1")
    with dg.instance_for_test() as instance:
        tick = _tick(defs, instance)
    assert tick.run_requests == [] and "job-1: attempt 1 is running" in tick.skip_message
