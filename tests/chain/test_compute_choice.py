"""LITHI_COMPUTE: the chain and the sensor talk to any ComputeClient chosen by import path."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.result_manifest import ResultManifestConfig, result_manifest
from pipeline.bundle.format import MANIFEST_NAME
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import CHAIN_JOB_NAME
from pipeline.defs.sensor import SENSOR_NAME
from resources.compute.client import ComputeError, JobSpec, NotSupported
from resources.compute.local import LocalCompute
from resources.dagster.clients import ComputeResource
from resources.settings import LithiEnv
from tests.helpers import custom_compute
from tests.helpers.chain import observations
from tests.helpers.refusals import one_line_refusal

CLIENT = "tests.helpers.custom_compute:StudioCompute"


def test_the_chain_and_the_sensor_use_the_client_named_by_import_path(
    tmp_path, labelled_samples, monkeypatch
):
    monkeypatch.setenv(custom_compute.ENDPOINT, str(labelled_samples.compute_root))
    job = labelled_samples.jobs["wine"]
    env = LithiEnv(
        home=tmp_path / "home",
        compute=CLIENT,
        job_id=job,
        trainer_config='{"auto_features": true, "epochs": 2}',
        num_workers=0,
    )
    defs = build_definitions(env)
    custom_compute.CALLS.clear()
    with dg.instance_for_test() as instance:
        sensor = defs.resolve_sensor_def(SENSOR_NAME)
        with dg.build_sensor_context(
            instance=instance, definitions=defs, resources=defs.resources
        ) as ctx:
            tick = sensor.evaluate_tick(ctx)
        (request,) = tick.run_requests
        result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(
            instance=instance, run_config=request.run_config, tags=request.tags
        )
    assert result.success
    assert custom_compute.CALLS[:2] == [f"status {job}", f"status {job}"]  # sensor, then chain
    assert not (tmp_path / "home" / "compute").exists()  # the local default was never used


@pytest.mark.parametrize(
    ("service", "message"),
    [
        ("tests.helpers.nowhere:X", "cannot import 'tests.helpers.nowhere'"),
        ("tests.helpers.custom_compute:NotAClient", "naming a subclass of"),
        ("tests.helpers.custom_compute:Missing", "naming a subclass of"),
    ],
)
def test_a_bad_client_path_is_one_line_naming_it(service, message):
    refusal = one_line_refusal(ComputeError, ComputeResource(service=service).client)
    assert refusal.startswith(f"Compute client {service!r}") and message in refusal


def _tick(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.SensorResult:
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    with dg.build_sensor_context(
        instance=instance, definitions=defs, resources=defs.resources
    ) as ctx:
        return sensor.evaluate_tick(ctx)


def test_a_client_that_only_follows_jobs_needs_no_submit(labelled_samples, monkeypatch, tmp_path):
    """``status`` and ``manifest_url`` are all a client must define: the sensor follows its job,
    and what the client does not define is refused in one line naming it."""
    monkeypatch.setenv(custom_compute.ENDPOINT, str(labelled_samples.compute_root))
    job = labelled_samples.jobs["wine"]
    version = LocalCompute(labelled_samples.compute_root).status(job).latest_version_id
    service = "tests.helpers.custom_compute:FollowingCompute"
    defs = build_definitions(LithiEnv(home=tmp_path / "home", compute=service, job_id=job))
    with dg.instance_for_test() as instance:
        (request,) = _tick(defs, instance).run_requests
    assert request.run_key == f"chain:{job}:{version}"
    client = ComputeResource(service=service).client()
    assert not client.can_resubmit
    spec = JobSpec(input_url="in", reference_url="ref")
    refused = one_line_refusal(NotSupported, client.submit, spec)
    assert refused == f"Compute client {service}: defines no submit; it only follows jobs"


def test_a_client_may_name_the_manifest_file_instead_of_its_folder(
    labelled_samples, monkeypatch, tmp_path
):
    """What the sensor observes and what the chain's first link reads is the bundle's folder."""
    monkeypatch.setenv(custom_compute.ENDPOINT, str(labelled_samples.compute_root))
    job = labelled_samples.jobs["wine"]
    folder = LocalCompute(labelled_samples.compute_root).manifest_url(job)
    service = "tests.helpers.custom_compute:ManifestFileCompute"
    assert ComputeResource(service=service).client().manifest_url(job).endswith(MANIFEST_NAME)
    defs = build_definitions(LithiEnv(home=tmp_path / "home", compute=service, job_id=job))
    with dg.instance_for_test() as instance:
        tick = _tick(defs, instance)
    (request,) = tick.run_requests
    (observed,) = observations(tick)
    assert observed.metadata["manifest_url"].value == folder
    res = defs.resources
    read = list(
        result_manifest(
            dg.build_asset_context(),
            config=ResultManifestConfig(**request.run_config["ops"]["result_manifest"]["config"]),
            compute=res["compute"],
            bundle_store=res["bundle_store"],
            chain_settings=res["chain_settings"],
        )
    )
    check, output = read
    assert check.passed and output.metadata["manifest_url"].value == folder
    assert output.value.url == folder
