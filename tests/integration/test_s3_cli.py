"""``lithi-bundle verify URL`` and ``lithi-bundle inspect URL`` on bundles in S3 (moto's server).

``verify`` downloads the bundle into a cache (``--cache-dir``, else a temporary one) with the
fetch's guarantees, then checks every rule on the local view; ``inspect`` reads the manifest
alone, remotely. The secret reaches the command only through the environment variable
``--credential-env`` names; the endpoint through ``AWS_ENDPOINT_URL_S3``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.bundle import format as fmt
from resources.settings import REPO_ROOT
from tests.helpers.bundles import make_input
from tests.helpers.s3 import SECRET_ENV, S3Store, child_env


def _cli(store: S3Store, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=REPO_ROOT,
        env=child_env(store, PYTHONPATH=str(REPO_ROOT), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def remote(tmp_path, s3_store: S3Store):
    snap = make_input(tmp_path / "src" / "v1")
    return snap, s3_store.upload_dir(snap.root, f"s3://{s3_store.new_bucket()}/bundles/v1")


def test_verify_and_inspect_take_an_s3_url(tmp_path, s3_store, remote):
    snap, url = remote
    cache = tmp_path / "cache"
    ok = _cli(s3_store, "verify", url, "--credential-env", SECRET_ENV, "--cache-dir", str(cache))
    assert ok.returncode == 0, ok.stderr
    assert f"VALID {url}" in ok.stdout and snap.identity.content_sha256 in ok.stdout
    assert (cache / "bundles" / snap.identity.version_id / fmt.MANIFEST_NAME).is_file()

    shown = _cli(s3_store, "inspect", url, "--credential-env", SECRET_ENV, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["snapshot"] == snap.identity.model_dump(mode="json")
    text = _cli(s3_store, "inspect", url, "--credential-env", SECRET_ENV)
    assert text.returncode == 0 and snap.identity.version_id in text.stdout

    # A tampered part: exit 1, one line naming the part; the secret is in no output.
    bad = snap.manifest.parts[0]
    data = bytearray((snap.root / bad.path).read_bytes())
    data[-20] ^= 0xFF
    s3_store.fs().pipe_file(f"{url.removeprefix('s3://')}/{bad.path}", bytes(data))
    refused = _cli(s3_store, "verify", url, "--credential-env", SECRET_ENV)  # a temporary cache
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"{url}/{bad.path}" in refused.stderr and len(refused.stderr.splitlines()) == 1
    for out in (ok, shown, text, refused):
        assert s3_store.secret not in out.stdout + out.stderr
        assert s3_store.access_key not in out.stdout + out.stderr


def test_a_url_the_store_refuses_is_one_line(tmp_path, s3_store, remote):
    _, url = remote
    denied = _cli(
        s3_store, "verify", url, "--credential-env", SECRET_ENV, **{SECRET_ENV: "AKIA0:wrong"}
    )
    assert denied.returncode == 1 and len(denied.stderr.splitlines()) == 1, denied.stderr
    assert url in denied.stderr and "wrong" not in denied.stderr
    unset = _cli(s3_store, "inspect", url, "--credential-env", "LITHI_TEST_NO_SUCH_VARIABLE")
    assert unset.returncode == 2 and "LITHI_TEST_NO_SUCH_VARIABLE" in unset.stderr
