"""Canary: a secret registered under a credential_ref is used for a download, and lands nowhere.

The result bundle is published to a remote store that refuses readers without the token (the
fake in ``tests/helpers/fake_remote.py``; no real object store is reachable here). The chain
downloads it through a registered credential reference, then no file the run wrote — checkpoint,
record, bundles, cache, logs, the Dagster instance's SQLite storage — and no log line contains
the secret.
"""

import logging
import secrets
import shutil
from pathlib import Path

import dagster as dg
import pytest

from assets import CHAIN_ASSETS
from assets.training_run import TrainingConfig
from resources.compute.local import LocalCompute
from resources.dagster.clients import BundleStoreResource, ComputeResource
from tests.helpers import fake_remote
from tests.helpers.chain import chain_resources

ENV = "LITHI_CANARY_STORE_TOKEN"


class RemoteResults(LocalCompute):
    """The local Compute, but its result bundles are read from the secured remote store."""

    def manifest_url(self, job_id: str, version_id: str | None = None) -> str:
        version = version_id or self.status(job_id).latest_version_id
        return f"{fake_remote.PROTOCOL}://{version}"


class RemoteResultsCompute(ComputeResource):
    """A Compute resource whose results live behind a credential."""

    def client(self) -> LocalCompute:
        return RemoteResults(Path(self.root), "inline")


def _files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.fixture
def remote(tmp_path):
    yield tmp_path / "remote"
    fake_remote.stop()


def test_secret_is_used_for_download_and_never_written(
    tmp_path, remote, labelled_samples, monkeypatch, caplog
):
    secret = "canary-" + secrets.token_hex(16)
    monkeypatch.setenv(ENV, secret)
    caplog.set_level(logging.DEBUG)
    job_id = labelled_samples.jobs["wine"]
    compute = LocalCompute(labelled_samples.compute_root, "inline")
    version = compute.status(job_id).latest_version_id
    shutil.copytree(Path(compute.manifest_url(job_id, version)), remote / version)
    fake_remote.serve(remote, secret)

    resources = chain_resources(tmp_path / "home", job_id, credential_ref="lab-store")
    resources["compute"] = RemoteResultsCompute(root=str(labelled_samples.compute_root))
    resources["bundle_store"] = BundleStoreResource(
        cache_dir=str(tmp_path / "home" / "cache"), credential_refs={"lab-store": ENV}
    )
    (tmp_path / "dagster_home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster_home")) as instance:
        result = dg.materialize(
            CHAIN_ASSETS,
            resources=resources,
            run_config=dg.RunConfig(
                ops={"training_run": TrainingConfig(epochs=1, auto_features=True)}
            ),
            instance=instance,
        )
        assert result.success
        log_text = "\n".join(str(e) for e in instance.all_logs(result.run_id))

    # The download really went through the secured store, with the token.
    opened = set(fake_remote.SecureFakeFS.opened)
    assert f"{version}/result-manifest.json" in opened
    assert any(p.startswith(f"{version}/parts/") for p in opened)

    # ...and the secret is nowhere: not in any file under the run's roots, nor in any log.
    fake_remote.stop()
    needle = secret.encode()
    assert _files_containing(tmp_path, needle) == []
    assert secret not in log_text
    assert secret not in caplog.text
    # The check above would see it: the canary is findable where it is put.
    (tmp_path / "probe.txt").write_bytes(b"x" + needle)
    assert _files_containing(tmp_path, needle) == [tmp_path / "probe.txt"]
