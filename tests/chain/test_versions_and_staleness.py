"""Every Compute version is a Dagster object, and Dagster's staleness is exactly what it shows.

Driven tick by tick over a real local Compute, like the daemon would: the sensor records each
version it sees as an observation of ``compute_versions`` (PARTIAL ones included, with
what changed since the parent). Staleness is read through GraphQL, as the UI reads it. What
Dagster 1.13 does, and the README says: an asset is stale when one of its *direct* inputs has a
data version other than the one it was built from; it does not project staleness further down.
So a newer version marks ``result_manifest`` stale, and re-reading an older version marks
``verified_snapshot`` stale; the links after them stay fresh until their own input changes.
"""

from __future__ import annotations

import dagster as dg

from assets import CHAIN_ASSETS, CHAIN_CHECKS
from assets.compute_versions import KEY, compute_versions
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import RESUBMIT_JOB_NAME, chain_run_config
from resources.compute.faults import FaultSpec
from tests.helpers.chain import (
    FAST_TRAINING,
    chain_resources,
    observations,
    sample_job,
    sensor_tick,
)
from tests.helpers.dagster_internals import observe
from tests.helpers.graphql import STALENESS, graphql_on, stale_status

CHAIN = [a.key.path[-1] for a in CHAIN_ASSETS][1:]  # the six materialized links


def _causes(query, asset: str) -> list[tuple[str, str]]:
    nodes = {n["assetKey"]["path"][-1]: n for n in query(STALENESS)["assetNodes"]}
    return [(c["reason"], c["key"]["path"][-1]) for c in nodes[asset]["staleCauses"]]


def _chain(resources, instance, job: str, version: str, partial: bool) -> None:
    config = chain_run_config(job, version, allow_partial=partial)
    config.ops.update(FAST_TRAINING.ops)
    result = dg.materialize(
        [*CHAIN_ASSETS, *CHAIN_CHECKS], resources=resources, run_config=config, instance=instance
    )
    assert result.success


CURRENCY = """
{
  assetCheckExecutions(
    assetKey: {path: ["training_run"]}, checkName: "model_is_current", limit: 1
  ) {
    status
    evaluation { success severity description }
  }
}
"""


def test_versions_are_observed_and_a_newer_one_makes_the_chain_stale(tmp_path):
    job = sample_job(tmp_path, "wine", FaultSpec(lose_fraction=0.3))
    resources = chain_resources(tmp_path, job, base_delay_seconds=0)
    defs = build_definitions(**resources)
    with dg.instance_for_test() as instance, graphql_on(instance) as query:
        first = sensor_tick(defs, instance, None)
        (partial_obs,) = observations(first)
        v1 = partial_obs.metadata["version_id"].value
        assert partial_obs.metadata["status"].value == "PARTIAL"
        assert partial_obs.metadata["outstanding"].value > 0
        assert partial_obs.metadata["change"].value == "first version"
        assert [r.job_name for r in first.run_requests] == [RESUBMIT_JOB_NAME]

        # Trained on the accepted parts of v1 (allowed explicitly): everything fresh.
        _chain(resources, instance, job, v1, partial=True)
        assert {a: stale_status(query)[a] for a in CHAIN} == dict.fromkeys(CHAIN, "FRESH")

        # The resubmission publishes v2: once observed, every link of the chain is stale.
        resubmit = defs.resolve_job_def(RESUBMIT_JOB_NAME)
        request = first.run_requests[0]
        assert resubmit.execute_in_process(
            run_config=request.run_config, instance=instance, resources=resources
        ).success
        second = sensor_tick(defs, instance, first.cursor)
        (done_obs,) = observations(second)
        v2 = done_obs.metadata["version_id"].value
        meta = done_obs.metadata
        assert meta["status"].value == "SUCCEEDED" and meta["parent_version_id"].value == v1
        moved = {c: meta[f"change/{c}"].value for c in ("accepted", "failed", "abstained")}
        assert sum(moved.values()) == partial_obs.metadata["outstanding"].value
        assert meta["change/outstanding"].value == -partial_obs.metadata["outstanding"].value
        assert stale_status(query) == dict.fromkeys(CHAIN, "FRESH") | {
            "result_manifest": "STALE",
            "compute_versions": "FRESH",  # external: what was observed is current
        }
        assert _causes(query, "result_manifest") == [("has a new data version", "compute_versions")]
        # Staleness stops at result_manifest; the model's own page says it is outdated
        (latest,) = query(CURRENCY)["assetCheckExecutions"]
        assert latest["status"] == "FAILED"
        assert latest["evaluation"]["severity"] == "WARN"
        assert latest["evaluation"]["description"] == (
            f"trained on {v1}, but the newest complete version is {v2} ({job})"
        )

        # Rebuilt from v2: fresh again. Reading v1 again marks every link downstream stale.
        _chain(resources, instance, job, v2, partial=False)
        assert {a: stale_status(query)[a] for a in CHAIN} == dict.fromkeys(CHAIN, "FRESH")
        dg.materialize(
            [*CHAIN_ASSETS],
            selection=["result_manifest"],
            resources=resources,
            run_config=chain_run_config(job, v1, allow_partial=True),
            instance=instance,
        )
        assert stale_status(query) == dict.fromkeys(CHAIN, "FRESH") | {
            "verified_snapshot": "STALE",
            "compute_versions": "FRESH",
        }
        assert _causes(query, "verified_snapshot") == [
            ("has a new data version", "result_manifest")
        ]

        # Both versions are recorded, each once, with its counts and digest.
        records = instance.fetch_observations(KEY, limit=10).records
        versions = [r.asset_observation.metadata["version_id"].value for r in records]
        assert sorted(versions) == sorted([v1, v2])
        assert observations(sensor_tick(defs, instance, second.cursor)) == []
        # Observing by hand records what the sensor did, change lines included
        (hand,) = observe(
            [compute_versions], resources=resources, instance=instance
        ).asset_observations_for_node("compute_versions")
        assert {k: getattr(v, "value", v) for k, v in hand.metadata.items()} == {
            k: getattr(v, "value", v) for k, v in meta.items()
        }
