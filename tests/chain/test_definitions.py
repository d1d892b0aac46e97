"""The code location loads, and its graph is exactly the chain: a cheap guard against drift."""

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets import CHAIN_GROUP
from pipeline.defs.definitions import build_definitions, defs
from tests.helpers.timing import limit

ROOT = Path(__file__).resolve().parents[2]

#: Each link's parents: the chain, and the training run beside the predictions it staged.
PARENTS = {
    "compute_versions": set(),
    "result_manifest": {"compute_versions"},
    "verified_snapshot": {"result_manifest"},
    "disjoint_index": {"verified_snapshot"},
    "training_run": {"disjoint_index"},
    "prediction_table": {"training_run"},
    "output_bundle": {"prediction_table", "training_run"},
}
#: The links the chain materializes: every one but the versions Compute publishes (external).
CHAIN = set(PARENTS) - {"compute_versions"}
CHECKS = {
    "result_manifest": {("result_manifest_complete", True)},
    "verified_snapshot": {("manifest_binds_every_file", True)},
    "disjoint_index": {("index_disjoint_and_covering", True)},
    "training_run": {("iterated_counts_reconcile", True), ("model_is_current", False)},
    "prediction_table": {("one_row_per_item", True)},
    "output_bundle": {("output_bundle_verifies", False)},
}


def test_assets_form_one_chain_in_one_group_with_descriptions_kinds_and_code_versions():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == set(PARENTS)
    for name in PARENTS:
        node = graph.get(dg.AssetKey(name))
        parents = {p.to_user_string() for p in node.parent_keys}
        assert parents == PARENTS[name], name
        assert node.group_name == CHAIN_GROUP
        assert node.description and node.kinds, name
        # Materialized links have code versions; the versions Compute publishes are external.
        assert bool(node.code_version) == (name in CHAIN), name
        assert node.is_external == (name not in CHAIN), name


def test_checks_jobs_schedule_and_sensor():
    graph = defs.resolve_asset_graph()
    found: dict[str, set] = {}
    for key in graph.asset_check_keys:
        spec = graph.get_check_spec(key)
        found.setdefault(key.asset_key.to_user_string(), set()).add((key.name, spec.blocking))
    assert found == CHECKS
    # The chain job materializes exactly the six links (checks in the same run); the
    # resubmission job is one op and touches no asset.
    chain = defs.resolve_job_def("compute_chain_job")
    assert {k.to_user_string() for k in chain.asset_layer.selected_asset_keys} == set(CHAIN)
    checks = {f"{a}_{name}" for a, specs in CHECKS.items() for name, _ in specs}
    inline = {"result_manifest_result_manifest_complete"}  # yielded by its asset's own step
    assert {n.name for n in chain.graph.nodes} == set(CHAIN) | checks - inline
    resubmit = defs.resolve_job_def("resubmit_outstanding_job")
    assert [n.name for n in resubmit.graph.nodes] == ["resubmit_outstanding"]
    assert not resubmit.asset_layer.selected_asset_keys
    schedule = defs.resolve_schedule_def("compute_chain_schedule")
    assert schedule.job_name == "compute_chain_job" and schedule.execution_timezone == "UTC"
    sensor = defs.resolve_sensor_def("compute_partial_sensor")
    assert {j.name for j in sensor.jobs} == {"compute_chain_job", "resubmit_outstanding_job"}
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_every_resource_an_asset_needs_is_provided():
    # Dagster raises on a missing resource key when the jobs are resolved.
    names = {j.name for j in build_definitions().resolve_all_job_defs()}
    assert {"compute_chain_job", "resubmit_outstanding_job"} <= names


def test_training_run_config_is_the_trainer_config_field_for_field():
    from assets.training_run import TrainingConfig
    from pipeline.training.reference_config import ReferenceConfig

    assert set(TrainingConfig.model_fields) == set(ReferenceConfig.model_fields) | {"trainer"}
    job = defs.resolve_job_def("compute_chain_job")
    ok = {"ops": {"training_run": {"config": {"features": ["pixels"], "epochs": 2}}}}
    assert dg.validate_run_config(job, ok)
    for bad, field in [({"reader": "bogus"}, "bogus"), ({"task": "ranking"}, "ranking")]:
        with pytest.raises(dg.DagsterInvalidConfigError, match=field):
            dg.validate_run_config(job, {"ops": {"training_run": {"config": bad}}})


def test_lithi_trainer_config_sets_the_run_config_defaults(monkeypatch):
    monkeypatch.setenv("LITHI_TRAINER_CONFIG", '{"auto_features": true, "epochs": 2}')
    job = build_definitions().resolve_job_def("compute_chain_job")
    config = dg.validate_run_config(job, {})["ops"]["training_run"]["config"]
    assert config["auto_features"] is True and config["epochs"] == 2
    assert config["trainer"] == "pipeline.training.reference:ReferenceTrainer"


@pytest.mark.parametrize(
    "argv",
    [
        # what a code server does: import, then build the repository (sensors' jobs resolved)
        ["-c", "from pipeline.defs.definitions import defs; defs.get_repository_def()"],
        ["-m", "pipeline.defs.demo", "--help"],
    ],
    ids=["code-location", "demo-help"],
)
def test_loading_the_code_location_says_no_warning(argv, tmp_path):
    """Every code server, every run and ``demo --help`` load it: a warning there is noise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITHI_")}
    done = subprocess.run(
        # the interpreter's own filters, as a user's code server has them (Dagster's internal
        # DeprecationWarnings among themselves stay hidden, as they do there)
        [sys.executable, *argv],
        cwd=ROOT,
        env=env | {"LITHI_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=limit(120),
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
