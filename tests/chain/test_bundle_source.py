"""LITHI_BUNDLE_URL: the chain trains on a result bundle at a URL, with no Compute job at all.

The bundle's newer versions are the bundles beside it whose manifest names it as their parent;
the sensor rebuilds when one lands. A bad URL, a folder without a manifest, or a PARTIAL bundle
is refused in one line naming the URL, and nothing is trained.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets._metadata import plain
from assets.result_manifest import ResultManifestConfig, result_manifest
from pipeline.bundle.manifest import JobInfo
from pipeline.bundle.stage import stage
from pipeline.bundle.verify import verify
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import CHAIN_JOB_NAME
from pipeline.defs.sensor import SENSOR_NAME
from pipeline.training.record import OutputRecord, read_record
from resources.compute.local import LocalCompute
from resources.settings import LithiEnv

TRAINING = '{"auto_features": true, "epochs": 2}'


@pytest.fixture
def published(tmp_path, labelled_samples) -> Path:
    """The wine result bundle, copied to a folder of versions as a publisher would leave it."""
    compute = LocalCompute(labelled_samples.compute_root)
    src = Path(compute.manifest_url(labelled_samples.jobs["wine"]))
    dest = tmp_path / "published" / "wine-v1"
    shutil.copytree(src, dest)
    return dest


def _env(tmp_path: Path, url: str, **kw) -> LithiEnv:
    return LithiEnv(
        home=tmp_path / "home", bundle_url=url, trainer_config=TRAINING, num_workers=0, **kw
    )


def _newer_version(v1: Path, name: str, status: str = "SUCCEEDED") -> Path:
    """A second version beside ``v1`` naming it as parent (the same rows, one attempt later)."""
    snap = verify(v1)
    table = pa.concat_tables([pq.read_table(p) for p in snap.part_paths()])
    partial = status == "PARTIAL"
    outstanding = table.column(snap.manifest.item_id_field).slice(0, 3) if partial else None
    return stage(
        table.slice(3) if partial else table,
        v1.parent / name,
        id_field=snap.manifest.item_id_field,
        kind="result",
        job=JobInfo(
            job_id=snap.manifest.job.job_id,
            status=status,
            attempt=2,
            parent_version_id=snap.identity.version_id,
        ),
        input=snap.manifest.input,
        outstanding_ids=outstanding,
    ).root


def test_the_chain_trains_on_a_bundle_url_with_no_compute(tmp_path, published):
    defs = build_definitions(_env(tmp_path, str(published)))
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(instance=instance)
    assert result.success
    assert all(c.passed for c in result.get_asset_check_evaluations())
    source = verify(published).identity
    training = result.asset_materializations_for_node("training_run")[0].metadata
    output = result.asset_materializations_for_node("output_bundle")[0].metadata
    record = read_record(output["record"].value, OutputRecord)
    assert record.training.snapshot == source  # the record binds the training snapshot...
    assert record.training.index_sha256 == plain(training["index_sha256"])  # ...the index...
    assert record.training.checkpoint.sha256 == plain(training["checkpoint_sha256"])  # weights
    out = verify(output["bundle_path"].value)
    assert out.manifest.kind == "prediction" and out.manifest.input.snapshot == source
    assert not (tmp_path / "home" / "compute").exists()  # no Compute was involved


def _tick(defs: dg.Definitions, instance, cursor=None):
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=defs, resources=defs.resources
    ) as ctx:
        return sensor.evaluate_tick(ctx)


def test_the_sensor_rebuilds_when_a_newer_version_lands_beside_it(tmp_path, published):
    defs = build_definitions(_env(tmp_path, str(published)))
    v1 = verify(published).identity.version_id
    with dg.instance_for_test() as instance:
        first = _tick(defs, instance)
        assert [r.tags["lithi/version_id"] for r in first.run_requests] == [v1]
        quiet = _tick(defs, instance, first.cursor)
        assert quiet.run_requests == [] and "already requested" in quiet.skip_message
        (published.parent / "half-written").mkdir()  # no manifest yet: not a version
        hidden = _newer_version(published, "wine-v2-staging")  # staged, not yet renamed
        hidden.rename(published.parent / ".wine-v2.staging-1-0123abcd-0123456789ab")
        assert _tick(defs, instance, quiet.cursor).run_requests == []  # not a version either
        v2 = verify(_newer_version(published, "wine-v2")).identity.version_id
        second = _tick(defs, instance, quiet.cursor)
        assert [r.tags["lithi/version_id"] for r in second.run_requests] == [v2]
        assert second.run_requests[0].run_key == f"chain:{v1}:{v2}"
        _newer_version(published.parent / "wine-v2", "wine-v3", status="PARTIAL")
        third = _tick(defs, instance, second.cursor)
        assert third.run_requests == []
        assert "nothing can resubmit them" in third.skip_message
        assert "train_on_partial is off" in third.skip_message


def _currency(result) -> list[dg.AssetCheckEvaluation]:
    return [e for e in result.asset_events if isinstance(e, dg.AssetCheckEvaluation)]


def test_the_model_says_when_a_newer_complete_version_waits_to_be_trained(tmp_path, published):
    """ "Is my model current?" answered on the model's own page: ``model_is_current`` passes
    after the chain trained the newest version, and warns, naming both, once a newer one lands
    (reported by the sensor, with no run), until that one is trained."""
    defs = build_definitions(_env(tmp_path, str(published)))
    v1 = verify(published).identity.version_id
    chain = defs.resolve_job_def(CHAIN_JOB_NAME)
    with dg.instance_for_test() as instance:
        first = _tick(defs, instance)
        assert [(e.passed, e.description) for e in _currency(first)] == [
            (False, f"no model is trained yet; the newest complete version is {v1} ({v1})")
        ]
        result = chain.execute_in_process(
            instance=instance, run_config=first.run_requests[0].run_config
        )
        in_run = {c.check_name: c for c in result.get_asset_check_evaluations()}
        assert in_run["model_is_current"].passed
        quiet = _tick(defs, instance, first.cursor)
        (now_current,) = _currency(quiet)
        assert now_current.passed and now_current.asset_key == dg.AssetKey("training_run")
        assert _currency(_tick(defs, instance, quiet.cursor)) == []  # unchanged: not repeated
        v2 = verify(_newer_version(published, "wine-v2")).identity.version_id
        second = _tick(defs, instance, quiet.cursor)
        (outdated,) = _currency(second)
        assert not outdated.passed and outdated.severity == dg.AssetCheckSeverity.WARN
        assert outdated.description == (
            f"trained on {v1}, but the newest complete version is {v2} ({v1})"
        )


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda root: root / "missing", "bundle URL {url}: no such directory"),
        (lambda root: root, "bundle URL {url}: no result-manifest.json, so it is not a finished"),
        (lambda root: "nosuchproto://bucket/v1", "bundle URL {url}: cannot be read"),
    ],
    ids=["no such path", "no manifest", "unknown protocol"],
)
def test_a_bad_bundle_url_is_one_line_and_trains_nothing(tmp_path, make, expected):
    """The chain's first link fails, so nothing after it runs (a failed step stops the chain, as
    the PARTIAL bundle's check does below); its body is called directly here."""
    root = tmp_path / "empty"
    root.mkdir()
    url = str(make(root))
    res = build_definitions(_env(tmp_path, url)).resources
    with pytest.raises(dg.Failure) as failure:
        list(
            result_manifest(
                dg.build_asset_context(),
                config=ResultManifestConfig(),
                compute=res["compute"],
                bundle_store=res["bundle_store"],
                chain_settings=res["chain_settings"],
            )
        )
    message = failure.value.description
    assert expected.format(url=url) in message
    assert url in message and "\n" not in message
    assert not (tmp_path / "home" / "artifacts").exists()  # nothing written, nothing trained


def test_a_partial_bundle_url_is_recorded_and_stopped_by_its_check(tmp_path, published):
    partial = _newer_version(published, "wine-partial", status="PARTIAL")
    defs = build_definitions(_env(tmp_path, str(partial)))
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(
            instance=instance, raise_on_error=False
        )
    assert not result.success
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "result_manifest_complete" and not check.passed
    assert str(partial) in check.description
    assert "PARTIAL with 3 items outstanding, so nothing is trained" in check.description
    recorded = result.asset_materializations_for_node("result_manifest")[0].metadata
    assert recorded["job_status"].value == "PARTIAL" and recorded["outstanding"].value == 3
    assert result.asset_materializations_for_node("verified_snapshot") == []


def test_bundle_url_and_a_compute_service_are_exclusive(monkeypatch, tmp_path):
    from resources.settings import SettingsError

    monkeypatch.setenv("LITHI_BUNDLE_URL", str(tmp_path))
    monkeypatch.setenv("LITHI_COMPUTE", "my_pkg.compute:Client")
    with pytest.raises(SettingsError, match="set only one of them"):
        LithiEnv.load()


def test_a_bundle_url_behind_a_credential_reference(tmp_path, published, monkeypatch):
    """A remote store (the token-checking fake of tests/helpers/fake_remote.py) read through a
    registered credential reference, the way an s3:// URL is."""
    from tests.helpers import fake_remote

    monkeypatch.setenv("STUDIO_STORE_TOKEN", "t0ken-for-the-test")
    fake_remote.serve(published.parent.parent, "t0ken-for-the-test")
    try:
        url = f"{fake_remote.PROTOCOL}://published/wine-v1"
        _newer_version(published, "wine-v2")
        env = _env(
            tmp_path,
            url,
            credential_refs="lab=STUDIO_STORE_TOKEN",
            credential_ref="lab",
        )
        defs = build_definitions(env)
        with dg.instance_for_test() as instance:
            result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(instance=instance)
        assert result.success
        manifest = result.asset_materializations_for_node("result_manifest")[0].metadata
        assert manifest["manifest_url"].value == f"{fake_remote.PROTOCOL}://published/wine-v2"
        assert any(
            p.startswith("published/wine-v2/parts/") for p in fake_remote.SecureFakeFS.opened
        )
    finally:
        fake_remote.stop()
