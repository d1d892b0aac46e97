"""A config the trainer refuses fails its run in one line, and the run is not retried: the same
config would fail the same way. A failure that may pass next time is still retried."""

from __future__ import annotations

import importlib

import dagster as dg
import pytest

from assets.training_run import TrainingConfig
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import CHAIN_JOB_NAME, chain_run_config
from resources.compute.local import LocalCompute

#: the project's dagster.yaml turns run retries on; so does this test's instance
RETRIES = {"run_retries": {"enabled": True, "max_retries": 2}}


def _run(defs, instance, job: str, version: str, training: dict) -> dg.DagsterRun:
    config = chain_run_config(job, version)
    config.ops["training_run"] = {"config": training}
    result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(
        run_config=config, instance=instance, raise_on_error=False
    )
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    assert run is not None
    return run


def test_a_config_the_trainer_refuses_is_one_line_and_never_retried(tmp_path, labelled_samples):
    defs = build_definitions(**labelled_samples.resources(tmp_path, "wine"))
    job = labelled_samples.jobs["wine"]
    version = LocalCompute(labelled_samples.compute_root).status(job).latest_version_id
    training = {**TrainingConfig(auto_features=True).model_dump(), "epochs": 0}
    with dg.instance_for_test(overrides=RETRIES) as instance:
        run = _run(defs, instance, job, version, training)
        failure = next(
            e
            for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
            if e.step_key == "training_run"
        )
        message = failure.dagster_event.step_failure_data.error.message.strip()
        assert run.tags["dagster/retry_on_asset_or_op_failure"] == "false"
        assert run.tags.get("dagster/will_retry") == "false"
    assert "epochs" in message and "\n" not in message.split(": ", 1)[1], message


def test_a_failure_that_may_pass_next_time_is_still_retried(
    tmp_path, labelled_samples, monkeypatch
):
    def lost(*args, **kwargs):
        raise RuntimeError("the node went away")

    # the module, not the asset that ``assets`` exports under the same name
    monkeypatch.setattr(importlib.import_module("assets.training_run"), "_train_in_process", lost)
    defs = build_definitions(**labelled_samples.resources(tmp_path, "wine"))
    job = labelled_samples.jobs["wine"]
    version = LocalCompute(labelled_samples.compute_root).status(job).latest_version_id
    training = TrainingConfig(auto_features=True, epochs=1).model_dump()
    with dg.instance_for_test(overrides=RETRIES) as instance:
        run = _run(defs, instance, job, version, training)
    assert "dagster/retry_on_asset_or_op_failure" not in run.tags
    assert run.tags.get("dagster/will_retry") == "true"


@pytest.fixture(autouse=True)
def _no_lithi_env(monkeypatch):
    for name in ("LITHI_TRAINER", "LITHI_TRAINER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
