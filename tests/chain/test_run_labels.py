"""A re-executed chain run says so: ``lithi/trigger`` is ``reexecution`` (or ``retry``), not the
``newer_manifest`` it inherited from the sensor's run with the rest of its tags."""

from __future__ import annotations

import dagster as dg
import yaml

from pipeline.defs.definitions import build_definitions
from pipeline.defs.instance import PROJECT_YAML
from pipeline.defs.jobs import CHAIN_JOB_NAME, chain_run_config
from pipeline.defs.run_labels import relabelled
from resources.compute.local import LocalCompute
from tests.helpers.graphql import graphql_on, launch

SENSOR_TAGS = {"lithi/trigger": "newer_manifest", "lithi/job_id": "j", "lithi/version_id": "v"}


def test_only_a_rerun_is_relabelled_and_only_once():
    assert relabelled(SENSOR_TAGS) == {}
    rerun = {**SENSOR_TAGS, "dagster/parent_run_id": "abc"}
    assert relabelled(rerun) == {
        "lithi/trigger": "reexecution",
        "lithi/first_trigger": "newer_manifest",
    }
    retried = {**rerun, "dagster/retry_number": "1"}
    assert relabelled(retried) == {
        "lithi/trigger": "retry",
        "lithi/first_trigger": "newer_manifest",
    }
    # a re-execution of a re-execution keeps the first trigger
    again = {**rerun, **relabelled(rerun), "lithi/trigger": "reexecution"}
    assert relabelled(again) == {}
    assert relabelled({**again, "dagster/retry_number": "2"}) == {
        "lithi/trigger": "retry",
        "lithi/first_trigger": "newer_manifest",
    }


def test_the_chain_job_relabels_a_run_carrying_its_parents_tags(tmp_path, labelled_samples):
    defs = build_definitions(**labelled_samples.resources(tmp_path, "wine"))
    job = labelled_samples.jobs["wine"]
    version = LocalCompute(labelled_samples.compute_root).status(job).latest_version_id
    chain = defs.resolve_job_def(CHAIN_JOB_NAME)
    first_step = [dg.AssetKey("result_manifest")]
    with dg.instance_for_test() as instance:
        first = chain.execute_in_process(
            run_config=chain_run_config(job, version),
            instance=instance,
            tags=SENSOR_TAGS,
            asset_selection=first_step,
        )
        # the tags Dagster gives a re-execution: the parent's, and the parent named
        rerun = chain.execute_in_process(
            run_config=chain_run_config(job, version),
            instance=instance,
            tags={
                **SENSOR_TAGS,
                "dagster/parent_run_id": first.run_id,
                "dagster/root_run_id": first.run_id,
            },
            asset_selection=first_step,
        )
        tags_first = instance.get_run_by_id(first.run_id).tags
        tags_rerun = instance.get_run_by_id(rerun.run_id).tags
    assert first.success and rerun.success
    assert tags_first["lithi/trigger"] == "newer_manifest"
    assert tags_rerun["lithi/trigger"] == "reexecution"
    assert tags_rerun["lithi/first_trigger"] == "newer_manifest"


REEXECUTE = """
mutation($params: ReexecutionParams!) {
  launchPipelineReexecution(reexecutionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId tags { key value } } }
    ... on PythonError { message }
  }
}
"""


def test_the_uis_reexecute_is_labelled_as_soon_as_it_is_launched(tmp_path, monkeypatch):
    """What the run page's Re-execute button sends, through the project's instance settings:
    the new run says ``reexecution`` while it is still queued, before any step could run."""
    monkeypatch.setenv("LITHI_HOME", str(tmp_path / "home"))
    settings = yaml.safe_load(PROJECT_YAML.read_text())
    with (
        dg.instance_for_test(overrides={"run_coordinator": settings["run_coordinator"]}) as inst,
        graphql_on(inst, read_only=False) as query,
    ):
        first = launch(query, CHAIN_JOB_NAME, tags=SENSOR_TAGS)
        assert first["__typename"] == "LaunchRunSuccess", first
        parent = first["run"]["runId"]
        assert inst.get_run_by_id(parent).tags["lithi/trigger"] == "newer_manifest"
        inst.report_run_failed(inst.get_run_by_id(parent))  # as a failed build ends
        again = query(REEXECUTE, params={"parentRunId": parent, "strategy": "ALL_STEPS"})
        again = again["launchPipelineReexecution"]
        assert again["__typename"] == "LaunchRunSuccess", again
        run = inst.get_run_by_id(again["run"]["runId"])
    assert run.status == dg.DagsterRunStatus.QUEUED
    assert run.tags["dagster/parent_run_id"] == parent
    assert run.tags["lithi/trigger"] == "reexecution"
    assert run.tags["lithi/first_trigger"] == "newer_manifest"
