"""A trainer value its trainer refuses fails the launch, in one line, before anything runs.

Dagster checks types at launch; the project's run coordinator (``pipeline/defs/dagster.yaml``)
checks the trainer's own constraints on every value a run's config gives ``training_run``.
"""

from __future__ import annotations

import dagster as dg
import pytest
import yaml

from pipeline.defs.instance import PROJECT_YAML
from pipeline.defs.launch_check import config_problem
from tests.helpers.graphql import graphql_on

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


LAUNCH = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on PythonError { message }
  }
}
"""

LOCATION = """
{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }
"""


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
        (repo,) = query(LOCATION)["repositoriesOrError"]["nodes"]
        selector = {
            "repositoryLocationName": repo["location"]["name"],
            "repositoryName": repo["name"],
            "jobName": "compute_chain_job",
        }
        bad = query(LAUNCH, params={"selector": selector, "runConfigData": _ops(epochs=0)})
        good = query(LAUNCH, params={"selector": selector, "runConfigData": _ops(epochs=2)})
        runs = {r.run_id: r for r in instance.get_runs()}
    refused = bad["launchRun"]
    assert refused["__typename"] == "PythonError"
    assert "training_run: epochs=0 is refused by" in refused["message"]
    (failed,) = [r for r in runs.values() if r.status == dg.DagsterRunStatus.FAILURE]
    assert failed.tags["dagster/max_retries"] == "0"  # refused again by any retry: none
    assert good["launchRun"]["__typename"] == "LaunchRunSuccess"
    assert runs[good["launchRun"]["run"]["runId"]].status == dg.DagsterRunStatus.QUEUED
