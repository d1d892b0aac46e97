"""Lineage through Dagster's GraphQL API, without a browser: the layer the UI reads from.

The code location is loaded in-process over the persisted instance of a finished chain run and
queried with the same schema the webserver serves at ``/graphql``. If these pass and the browser
test fails, the UI (or its rendering) broke; if these fail, the definitions or the recorded
metadata did.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from assets import CHAIN_ASSETS, CHAIN_GROUP
from assets._metadata import plain
from pipeline.defs.definitions import defs
from pipeline.defs.jobs import CHAIN_JOB_NAME
from tests.helpers.chain import CHAIN_EDGES
from tests.helpers.graphql import Query, graphql_on, stale_status

if TYPE_CHECKING:
    from tests.helpers.chain import LineageInstance

CHAIN = [a.key.path[-1] for a in CHAIN_ASSETS]  # result_manifest → … → output_bundle


ASSET_NODES = """
{
  assetNodes {
    assetKey { path }
    groupName
    dependencyKeys { path }
    dependedByKeys { path }
    assetChecksOrError {
      ... on AssetChecks {
        checks {
          name
          executionForLatestMaterialization { runId status evaluation { success } }
        }
      }
    }
  }
}
"""

#: Every metadata entry kind the chain writes, as the UI reads it (see ``_value``).
ENTRY = """
fragment Entry on MetadataEntry {
  label
  ... on TextMetadataEntry { text }
  ... on PathMetadataEntry { path }
  ... on FloatMetadataEntry { floatValue }
  ... on IntMetadataEntry { intValue }
  ... on MarkdownMetadataEntry { mdStr }
  ... on JsonMetadataEntry { jsonString }
}
"""

#: An asset's newest ``$limit`` observations and materializations, with their metadata.
EVENTS = (
    """
query ($path: [String!]!, $limit: Int!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetObservations(limit: $limit) {
        runId
        description
        tags { key value }
        metadataEntries { ...Entry }
      }
      assetMaterializations(limit: $limit) {
        runId
        metadataEntries { ...Entry }
      }
    }
    ... on AssetNotFoundError { message }
  }
}
"""
    + ENTRY
)

RUNS_BY_TAG = """
query ($key: String!, $value: String!) {
  runsOrError(filter: {tags: [{key: $key, value: $value}]}) {
    ... on Runs { results { runId jobName status tags { key value } } }
    ... on PythonError { message }
  }
}
"""


@pytest.fixture(scope="module")
def graphql(lineage_instance: LineageInstance) -> Iterator[Query]:
    """Run GraphQL queries against the instance with the definitions loaded in-process."""
    with lineage_instance.instance() as instance, graphql_on(instance) as query:
        yield query


def _value(entry: dict[str, Any]) -> object:
    for field in ("text", "path", "floatValue", "intValue", "mdStr", "jsonString"):
        if field in entry:
            return entry[field]
    return None


def _latest_metadata(graphql: Query, asset: str) -> tuple[str, dict[str, object]]:
    data = graphql(EVENTS, path=[asset], limit=1)["assetOrError"]
    assert "assetMaterializations" in data, f"{asset}: {data}"
    mats = data["assetMaterializations"]
    assert mats, f"{asset} has no materialization in the instance"
    return mats[0]["runId"], {e["label"]: _value(e) for e in mats[0]["metadataEntries"]}


def _nodes(graphql: Query) -> dict[str, dict[str, Any]]:
    return {n["assetKey"]["path"][-1]: n for n in graphql(ASSET_NODES)["assetNodes"]}


def test_the_six_assets_are_one_group(graphql):
    nodes = _nodes(graphql)
    assert sorted(nodes) == sorted(CHAIN)
    assert {name: n["groupName"] for name, n in nodes.items()} == dict.fromkeys(CHAIN, CHAIN_GROUP)


def test_edges_are_exactly_the_chain(graphql):
    nodes = _nodes(graphql)
    upstream = {
        name: sorted(k["path"][-1] for k in n["dependencyKeys"]) for name, n in nodes.items()
    }
    downstream = {
        name: sorted(k["path"][-1] for k in n["dependedByKeys"]) for name, n in nodes.items()
    }
    assert upstream == {n: sorted(a for a, b in CHAIN_EDGES if b == n) for n in CHAIN}
    assert downstream == {n: sorted(b for a, b in CHAIN_EDGES if a == n) for n in CHAIN}


def test_training_run_metadata_names_the_data_it_was_trained_on(graphql, lineage_instance):
    snap_run, snapshot = _latest_metadata(graphql, "verified_snapshot")
    train_run, training = _latest_metadata(graphql, "training_run")
    assert snap_run == train_run == lineage_instance.run_id

    sha = plain(snapshot["snapshot/content_sha256"])
    assert isinstance(sha, str) and len(sha) == 64, snapshot
    assert plain(training["snapshot/content_sha256"]) == sha
    assert training["snapshot/version_id"] == lineage_instance.version_id
    assert len(plain(training["checkpoint_sha256"])) == 64
    assert str(training["record"]).endswith(".json")
    assert "data:image/svg+xml;base64," in str(training["loss_curve"])
    assert 0.5 < float(training["holdout_accuracy"]) <= 1.0

    _, output = _latest_metadata(graphql, "output_bundle")
    assert plain(output["input/content_sha256"]) == sha


def test_every_asset_check_is_shown_and_passed(graphql, lineage_instance):
    expected = {(k.asset_key.path[-1], k.name) for k in defs.resolve_asset_graph().asset_check_keys}
    assert expected, "the chain defines no asset checks"
    seen: dict[tuple[str, str], dict[str, Any] | None] = {}
    for name, node in _nodes(graphql).items():
        for check in node["assetChecksOrError"].get("checks", []):
            seen[(name, check["name"])] = check["executionForLatestMaterialization"]
    assert set(seen) == expected
    for key, execution in seen.items():
        assert execution is not None, f"check {key} was never evaluated"
        assert execution["runId"] == lineage_instance.run_id, key
        assert execution["status"] == "SUCCEEDED", (key, execution)
        assert execution["evaluation"]["success"] is True, key


def test_the_run_carries_the_version_that_triggered_it(graphql, lineage_instance):
    data = graphql(RUNS_BY_TAG, key="lithi/version_id", value=lineage_instance.version_id)
    runs = data["runsOrError"]["results"]
    assert [r["runId"] for r in runs] == [lineage_instance.run_id]
    run = runs[0]
    assert run["jobName"] == CHAIN_JOB_NAME
    assert run["status"] == "SUCCESS"
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags["lithi/job_id"] == lineage_instance.job_id
    assert tags["lithi/trigger"] == "newer_manifest"


def _history(graphql: Query, asset: str, kind: str) -> list[dict[str, object]]:
    """An asset's observations or materializations, newest first, as {label: value} (+ runId)."""
    events = graphql(EVENTS, path=[asset], limit=20)["assetOrError"][kind]
    return [
        {"runId": e["runId"], **{m["label"]: _value(m) for m in e["metadataEntries"]}}
        for e in events
    ]


def test_compute_versions_shows_the_partial_version_and_what_the_resubmission_changed(
    graphql, lineage_instance
):
    seen = _history(graphql, "compute_versions", "assetObservations")
    by_version = {o["version_id"]: o for o in seen}
    assert set(by_version) == {lineage_instance.partial_version_id, lineage_instance.version_id}
    v1 = by_version[lineage_instance.partial_version_id]
    v2 = by_version[lineage_instance.version_id]

    assert v1["status"] == "PARTIAL" and v2["status"] == "SUCCEEDED"
    assert v1["outstanding"] > 0 and v2["outstanding"] == 0
    for v in (v1, v2):  # a version's items are the rows it holds; outstanding ones are apart
        assert v["accepted"] + v["failed"] + v["abstained"] == v["items"]
    assert v1["items"] + v1["outstanding"] == v2["items"]
    assert v2["parent_version_id"] == lineage_instance.partial_version_id
    # What changed is computed from the two manifests, not echoed from the sensor's input.
    assert v2["change/accepted"] == v2["accepted"] - v1["accepted"] > 0
    assert v2["change/outstanding"] == -v1["outstanding"] == -v2["change/items"]
    assert f"accepted +{v2['change/accepted']}" in str(v2["change"])
    assert v1["change"] == "first version"
    assert plain(v1["content_sha256"]) != plain(v2["content_sha256"])


def test_training_run_keeps_the_checkpoint_of_each_version_it_was_trained_on(
    graphql, lineage_instance
):
    runs = _history(graphql, "training_run", "assetMaterializations")
    assert [r["runId"] for r in runs] == [lineage_instance.run_id, lineage_instance.partial_run_id]
    newest, older = runs
    assert newest["snapshot/version_id"] == lineage_instance.version_id
    assert older["snapshot/version_id"] == lineage_instance.partial_version_id
    assert plain(newest["checkpoint_sha256"]) != plain(older["checkpoint_sha256"])
    assert plain(newest["snapshot/content_sha256"]) != plain(older["snapshot/content_sha256"])
    # Each points at its own record, so the older checkpoint is still reachable from the UI.
    assert newest["record"] != older["record"]


def test_after_the_rebuild_every_link_is_fresh(graphql):
    assert {a: stale_status(graphql)[a] for a in CHAIN} == dict.fromkeys(CHAIN, "FRESH")
