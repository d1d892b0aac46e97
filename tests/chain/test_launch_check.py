"""A trainer value its trainer refuses fails the launch, in one line, before anything runs.

Dagster checks types at launch; the project's run coordinator (``pipeline/defs/dagster.yaml``)
checks the trainer's own constraints on every value a run's config gives ``training_run``.
"""

from __future__ import annotations

import dagster as dg
import pytest
import yaml

from assets import _metadata as md
from pipeline.bundle.manifest import Schema, SchemaField
from pipeline.defs.definitions import build_definitions, defs
from pipeline.defs.instance import PROJECT_YAML
from pipeline.defs.jobs import CHAIN_JOB_NAME
from pipeline.defs.launch_check import RecordedSchema, config_problem, trainer_defaults
from resources.compute.local import LocalCompute
from tests.helpers.dagster_internals import JobSnap
from tests.helpers.graphql import graphql_on, launch

TRAINER = "pipeline.training.reference:ReferenceTrainer"


def _ops(op: str = "training_run", **config: object) -> dict:
    return {"ops": {op: {"config": {"trainer": TRAINER, **config}}}}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"epochs": 0}, "training_run: epochs=0 is refused by"),
        ({"learning_rate": -0.1}, "training_run: learning_rate=-0.1 is refused by"),
    ],
)
def test_a_value_the_trainer_refuses_is_named(given, said):
    problem = config_problem(_ops(**given))
    assert problem is not None and problem.startswith(said) and "\n" not in problem


def test_values_left_to_the_chain_and_other_ops_are_not_judged():
    assert config_problem(_ops(epochs=2)) is None  # label, features...: the chain's defaults
    assert config_problem({"ops": {"result_manifest": {"config": {"job_id": "j"}}}}) is None
    assert config_problem({}) is None
    # a named chain's training_run has its own op name
    assert config_problem(_ops("digits__training_run", epochs=0)).startswith("digits__training_run")


def test_an_unknown_trainer_is_refused():
    problem = config_problem({"ops": {"training_run": {"config": {"trainer": "no.such:T"}}}})
    assert problem is not None and "cannot import" in problem


def test_the_launchpad_refuses_it_and_queues_a_good_one(tmp_path, monkeypatch):
    """What the UI's Launchpad sends, through the project's instance settings."""
    monkeypatch.setenv("LITHI_HOME", str(tmp_path / "home"))
    settings = yaml.safe_load(PROJECT_YAML.read_text())
    with (
        dg.instance_for_test(
            overrides={"run_coordinator": settings["run_coordinator"]}
        ) as instance,
        graphql_on(instance, read_only=False) as query,
    ):
        bad = launch(query, CHAIN_JOB_NAME, _ops(epochs=0))
        good = launch(query, CHAIN_JOB_NAME, _ops(epochs=2))
        runs = {r.run_id: r for r in instance.get_runs()}
    assert bad["__typename"] == "PythonError"
    assert "training_run: epochs=0 is refused by" in bad["message"]
    (failed,) = [r for r in runs.values() if r.status == dg.DagsterRunStatus.FAILURE]
    assert failed.tags["dagster/max_retries"] == "0"  # refused again by any retry: none
    assert good["__typename"] == "LaunchRunSuccess"
    assert runs[good["run"]["runId"]].status == dg.DagsterRunStatus.QUEUED


def test_a_run_that_leaves_the_trainer_to_the_chain_is_judged_with_its_defaults():
    """The Launchpad need not repeat the trainer's path: the job's own defaults supply it."""
    defaults = trainer_defaults(JobSnap.from_job_def(defs.resolve_job_def(CHAIN_JOB_NAME)))
    assert set(defaults) == {"training_run"}
    assert defaults["training_run"]["trainer"] == TRAINER
    given = {"ops": {"training_run": {"config": {"epochs": 0}}}}
    assert config_problem(given) is None  # without the defaults nothing says it trains
    problem = config_problem(given, defaults)
    assert problem is not None and problem.startswith("training_run: epochs=0 is refused by")
    # the chain's own config, given nothing: checked when the location loaded, not again
    assert config_problem({}, defaults) is None


def _recorded(*columns: str) -> RecordedSchema:
    fields = [SchemaField(name="item_id", type="string", nullable=False)]
    fields += [SchemaField(name=c, type="float64", nullable=False) for c in columns]
    fields += [SchemaField(name="lithi_label", type="int64", nullable=True)]
    return RecordedSchema(Schema(fields=fields), "item_id", job_id="j", version_id="v1")


def test_a_feature_the_bundle_lacks_is_named_with_the_schema_it_was_checked_on():
    recorded = _recorded("alcohol", "hue")
    schemas = {"": recorded}.get
    problem = config_problem(_ops(features=["alcohol", "colour"]), schemas=schemas)
    assert problem is not None and "\n" not in problem
    assert problem.startswith("training_run: ") and "'colour'" in problem
    assert problem.endswith("; the bundle as result_manifest last read it: j version v1")
    assert config_problem(_ops(features=["alcohol", "hue"]), schemas=schemas) is None
    # a named chain's op reads its own chain's schema
    assert (
        config_problem(_ops("digits__training_run", features=["colour"]), schemas=schemas) is None
    )
    digits = {"digits": recorded}.get
    assert "'colour'" in config_problem(
        _ops("digits__training_run", features=["colour"]), schemas=digits
    )


def test_a_run_pinning_a_version_nobody_recorded_is_left_to_the_step():
    schemas = {"": _recorded("alcohol")}.get
    config = _ops(features=["colour"])
    for pin in ({"version_id": "v2"}, {"job_id": "other"}):
        pinned = {"ops": {**config["ops"], "result_manifest": {"config": pin}}}
        assert config_problem(pinned, schemas=schemas) is None
    same = {"ops": {**config["ops"], "result_manifest": {"config": {"version_id": "v1"}}}}
    assert config_problem(same, schemas=schemas) is not None


def test_the_launchpad_refuses_a_feature_the_bundle_lacks(tmp_path, monkeypatch, labelled_samples):
    """After the chain read a manifest, the Launchpad's feature names are checked against it."""
    monkeypatch.setenv("LITHI_HOME", str(tmp_path / "home"))
    settings = yaml.safe_load(PROJECT_YAML.read_text())
    job = labelled_samples.jobs["wine"]
    version = LocalCompute(labelled_samples.compute_root).status(job).latest_version_id
    read = build_definitions(**labelled_samples.resources(tmp_path, "wine"))
    with (
        dg.instance_for_test(
            overrides={"run_coordinator": settings["run_coordinator"]}
        ) as instance,
        graphql_on(instance, read_only=False) as query,
    ):
        read.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(
            run_config={"ops": {"result_manifest": {"config": {"job_id": job}}}},
            asset_selection=[dg.AssetKey("result_manifest")],
            instance=instance,
        )
        # no trainer path: the Launchpad gives only what the user typed
        typed = {"ops": {"training_run": {"config": {"features": ["alcohol", "colour"]}}}}
        bad = launch(query, CHAIN_JOB_NAME, typed)
        fine = {"ops": {"training_run": {"config": {"auto_features": True}}}}
        good = launch(query, CHAIN_JOB_NAME, fine)
    assert bad["__typename"] == "PythonError", bad
    line = bad["message"].strip().splitlines()[-1]
    assert "'colour'" in line and line.endswith(f"last read it: {job} version {version}"), line
    assert good["__typename"] == "LaunchRunSuccess", good


def test_the_recorded_column_schema_reads_back_as_the_declared_one():
    declared = _recorded("alcohol").schema  # nullable and non-null fields
    assert md.schema_of(md.column_schema(declared, "item_id")) == declared
