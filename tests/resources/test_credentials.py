"""Credential refs resolve from the environment at use; the secret never shows or persists."""

from __future__ import annotations

import pickle

import fsspec
import pyarrow as pa
import pytest

from pipeline.bundle.errors import IncompleteBundle
from pipeline.bundle.stage import stage
from pipeline.bundle.verify import verify
from resources.bundle_store import BundleStore
from resources.credentials import (
    CredentialRegistry,
    MissingSecret,
    Secret,
    UnknownCredential,
)
from tests.helpers.fake_remote import PROTOCOL, SecureFakeFS, serve, stop

SECRET = "s3cr3t-canary-7f1d"


def test_resolve_reads_the_environment_at_the_moment_of_use(monkeypatch):
    reg = CredentialRegistry({"lab": "LITHI_TEST_TOKEN"})
    monkeypatch.delenv("LITHI_TEST_TOKEN", raising=False)
    with pytest.raises(MissingSecret) as e:
        reg.resolve("lab")
    assert "lab" in str(e.value) and "LITHI_TEST_TOKEN" in str(e.value)
    monkeypatch.setenv("LITHI_TEST_TOKEN", SECRET)  # set after the registry was built
    assert reg.resolve("lab").reveal() == SECRET
    monkeypatch.setenv("LITHI_TEST_TOKEN", "rotated")
    assert reg.resolve("lab").reveal() == "rotated"
    assert reg.refs == {"lab": "LITHI_TEST_TOKEN"}


def test_errors_and_reprs_never_contain_the_value(monkeypatch):
    monkeypatch.setenv("LITHI_TEST_TOKEN", SECRET)
    reg = CredentialRegistry({"lab": "LITHI_TEST_TOKEN"})
    s = reg.resolve("lab")
    assert isinstance(s, Secret) and s == Secret(SECRET)
    assert repr(s) == "Secret('***')" and str(s) == "***" and f"{s}" == "***"
    assert SECRET not in repr([s, {"k": s}])
    with pytest.raises(TypeError):
        pickle.dumps(s)
    with pytest.raises(UnknownCredential) as e:
        reg.resolve("other")
    assert "other" in str(e.value) and "lab" in str(e.value) and SECRET not in str(e.value)
    monkeypatch.setenv("LITHI_TEST_TOKEN", "no-colon")
    with pytest.raises(MissingSecret) as e:
        reg.storage_options_for("lab", "s3://bucket/x")
    assert "no-colon" not in str(e.value) and "LITHI_TEST_TOKEN" in str(e.value)


def test_storage_options_per_protocol(monkeypatch):
    reg = CredentialRegistry({"aws": "LITHI_AWS", "tok": "LITHI_TOK"})
    monkeypatch.setenv("LITHI_AWS", "AKIA123:abc/def")
    monkeypatch.setenv("LITHI_TOK", SECRET)
    assert reg.storage_options_for("aws", "s3://b/k") == {"key": "AKIA123", "secret": "abc/def"}
    assert reg.storage_options_for("tok", "gs://b/k") == {"token": SECRET}
    assert reg.storage_options_for("tok", f"{PROTOCOL}://b") == {"token": SECRET}
    with pytest.raises(ValueError, match="environment variable name"):
        CredentialRegistry({"bad": "not a name"})


@pytest.fixture
def remote(tmp_path):
    served = tmp_path / "remote"
    stage(
        pa.table({"id": [f"r{i}" for i in range(30)], "x": list(range(30))}),
        served / "bundles" / "b1",
        id_field="id",
        kind="input",
        rows_per_part=10,
    )
    serve(served, SECRET)
    yield f"{PROTOCOL}://bundles/b1"
    stop()


def test_the_fake_remote_refuses_a_missing_or_wrong_token(remote):
    for options in ({}, {"token": "wrong"}):
        fs, path = fsspec.core.url_to_fs(remote, skip_instance_cache=True, **options)
        with pytest.raises(PermissionError) as e:
            fs.cat_file(f"{path}/result-manifest.json")
        assert SECRET not in str(e.value)
    fs, path = fsspec.core.url_to_fs(remote, token=SECRET, skip_instance_cache=True)
    assert b'"manifest_version": 1' in fs.cat_file(f"{path}/result-manifest.json")


def test_the_store_fetches_through_a_registered_credential_ref(tmp_path, remote, monkeypatch):
    monkeypatch.setenv("LITHI_REMOTE_TOKEN", SECRET)
    store = BundleStore(tmp_path / "cache", CredentialRegistry({"remote": "LITHI_REMOTE_TOKEN"}))
    with pytest.raises(PermissionError):
        store.fetch(remote)  # no credential_ref: refused like a real 403
    assert list(store.objects_dir.iterdir()) == []
    got = store.fetch(remote, credential_ref="remote")
    assert got.files_downloaded == 3
    assert verify(got.path, trusted=store.trusted).manifest.counts.items == 30
    with pytest.raises(UnknownCredential):
        BundleStore(tmp_path / "c2").fetch(remote, credential_ref="remote")
    # the secret is not kept anywhere: no cached filesystem holds it, no cache file contains it
    assert not any(getattr(fs, "_token", None) == SECRET for fs in SecureFakeFS._cache.values())
    for p in (tmp_path / "cache").rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p


def test_no_manifest_on_the_remote_reads_nothing_else(tmp_path, remote, monkeypatch):
    root = SecureFakeFS.served_root / "bundles" / "b1"
    (root / "result-manifest.json").unlink()
    monkeypatch.setenv("LITHI_REMOTE_TOKEN", SECRET)
    store = BundleStore(tmp_path / "cache", CredentialRegistry({"remote": "LITHI_REMOTE_TOKEN"}))
    SecureFakeFS.opened.clear()
    with pytest.raises(IncompleteBundle):
        store.fetch(remote, credential_ref="remote")
    assert SecureFakeFS.opened == ["bundles/b1/result-manifest.json"]  # tried the manifest only
    assert list(store.objects_dir.iterdir()) == []


def test_compute_reads_a_remote_input_through_its_credential_ref(tmp_path, monkeypatch):
    from pipeline.defs.samples import stage_sample
    from resources.compute.client import ComputeError, JobSpec
    from resources.compute.local import LocalCompute

    served = tmp_path / "remote"
    inp, ref = stage_sample("wine", served)
    serve(served, SECRET)
    try:
        monkeypatch.setenv("LITHI_REMOTE_TOKEN", SECRET)
        registry = CredentialRegistry({"remote": "LITHI_REMOTE_TOKEN"})
        compute = LocalCompute(tmp_path / "compute", executor="inline", credentials=registry)
        spec = JobSpec(
            input_url=f"{PROTOCOL}://{inp.root.name}",
            reference_url=f"{PROTOCOL}://{ref.root.name}",
            credential_ref="remote",
        )
        job = compute.submit(spec)
        st = compute.status(job)
        assert st.state == "SUCCEEDED", st.message
        result = verify(st.latest_manifest_url)
        assert result.manifest.input.credential_ref == "remote"
        assert result.manifest.input.snapshot == inp.identity
        with pytest.raises(ComputeError, match="not registered"):
            compute.submit(spec.model_copy(update={"credential_ref": "unregistered"}))
        for p in (tmp_path / "compute").rglob("*"):  # job state names the variable, not the value
            if p.is_file():
                assert SECRET.encode() not in p.read_bytes(), p
        assert (
            b"LITHI_REMOTE_TOKEN" in (tmp_path / "compute" / "jobs" / job / "job.json").read_bytes()
        )
    finally:
        stop()
