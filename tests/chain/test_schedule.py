"""The schedule: on by default, pins the latest complete version, never retrains unchanged data."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from assets.training_run import TrainingConfig
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import CHAIN_JOB_NAME
from pipeline.defs.schedule import SCHEDULE_NAME
from resources.compute.faults import FaultSpec
from tests.helpers.chain import chain_resources, sample_job


def _tick(defs: dg.Definitions, instance: dg.DagsterInstance):
    schedule = defs.resolve_schedule_def(SCHEDULE_NAME)
    with dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=datetime(2026, 12, 3, 3, 0, tzinfo=UTC),
        resources=defs.resources,
    ) as context:
        return schedule.evaluate_tick(context)


def test_a_tick_pins_the_latest_complete_version_and_skips_it_once_built(
    tmp_path, labelled_samples
):
    defs = build_definitions(**labelled_samples.resources(tmp_path, "wine"))
    job = labelled_samples.jobs["wine"]
    assert (
        defs.resolve_schedule_def(SCHEDULE_NAME).default_status == dg.DefaultScheduleStatus.RUNNING
    )
    with dg.instance_for_test() as instance:
        first = _tick(defs, instance)
        (request,) = first.run_requests
        version = request.tags["lithi/version_id"]
        assert request.tags["lithi/job_id"] == job and request.tags["lithi/trigger"] == "schedule"
        pinned = request.run_config["ops"]["result_manifest"]["config"]
        assert (pinned["job_id"], pinned["version_id"]) == (job, version)
        assert request.run_key == f"schedule:{job}:{version}:20261203T0300"

        config = dict(request.run_config)
        config["ops"] = {
            **config["ops"],
            "training_run": {"config": TrainingConfig(epochs=1, auto_features=True).model_dump()},
        }
        result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(
            run_config=config, instance=instance, tags=request.tags
        )
        assert result.success
        second = _tick(defs, instance)
        assert second.run_requests == []
        assert f"the chain of {version} already succeeded; nothing new" in second.skip_message


def test_a_partial_job_is_left_to_the_sensor(tmp_path):
    job = sample_job(tmp_path, "wine", FaultSpec(lose_fraction=0.3))
    defs = build_definitions(**chain_resources(tmp_path, job))
    with dg.instance_for_test() as instance:
        tick = _tick(defs, instance)
    assert tick.run_requests == []
    assert f"{job}: latest version is PARTIAL; the sensor handles it" in tick.skip_message


def test_a_version_whose_chain_failed_is_not_requested_again(tmp_path, labelled_samples):
    """A failed build of unchanged data fails again: the schedule says so instead of
    re-requesting it every tick."""
    defs = build_definitions(**labelled_samples.resources(tmp_path, "wine"))
    job = labelled_samples.jobs["wine"]
    with dg.instance_for_test() as instance:
        (request,) = _tick(defs, instance).run_requests
        version = request.tags["lithi/version_id"]
        config = dict(request.run_config)
        config["ops"] = {  # epochs the trainer refuses: the run fails in training_run
            **config["ops"],
            "training_run": {"config": {**TrainingConfig().model_dump(), "epochs": 0}},
        }
        failed = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(
            run_config=config, instance=instance, tags=request.tags, raise_on_error=False
        )
        assert not failed.success
        again = _tick(defs, instance)
    assert again.run_requests == []
    assert f"{job}: the chain of {version} FAILED (1 run(s)" in again.skip_message
