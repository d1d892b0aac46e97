"""The README's S3 variant of "Train on your own bundle", run as written against moto's S3 server.

The second shell block of the section is read out of the README and run with bash after the
first block's staging and ``export`` lines, in a scratch directory laid out like the repository
root. Only what names the user's store changes: the endpoint becomes the test server's, the
placeholder credential the server's IAM key, ``my-bucket`` a new bucket. The install line is not
run again (the suite's environment is that install).
"""

from __future__ import annotations

import os
import re
import subprocess

from pipeline.bundle.verify import verify
from resources.bundle_store import BundleStore
from resources.credentials import CredentialRegistry
from resources.settings import REPO_ROOT
from tests.helpers.s3 import S3Store
from tests.integration.test_examples import readme_commands, scratch  # noqa: F401


def s3_commands() -> list[str]:
    """The second shell block under "## Train on your own bundle": the S3 variant."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## Train on your own bundle") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the section has the local commands, then the S3 variant"
    return [line for line in blocks[1].splitlines() if line.strip()]


def test_the_readme_s3_variant_trains_from_and_publishes_to_s3(
    scratch,  # noqa: F811
    s3_store: S3Store,
    monkeypatch,
):
    bucket = s3_store.new_bucket()
    local = readme_commands()[1:4]  # stage the table, export the settings, set up the instance
    install, *commands = s3_commands()
    assert install.startswith(".venv/bin/python -m pip install")
    script = "\n".join(["set -euo pipefail", *local, *commands])
    assert "http://127.0.0.1:9000" in script and "'<access_key_id>:<secret_access_key>'" in script
    script = (
        script.replace("http://127.0.0.1:9000", s3_store.endpoint)
        .replace("'<access_key_id>:<secret_access_key>'", f"'{s3_store.credential}'")
        .replace("my-bucket", bucket)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITHI_", "DAGSTER_", "AWS_"))}
    env["LITHI_NUM_WORKERS"] = "0"
    out = subprocess.run(
        ["bash", "-c", script], cwd=scratch, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"VALID s3://{bucket}/outputs/" in out.stdout  # lithi-bundle verify URL said so

    source = verify(scratch / "work" / "bundles" / "mine-v1").identity
    listed = sorted(s3_store.fs().ls(f"{bucket}/outputs", detail=False))
    published, training = listed  # one output bundle, its training artifacts beside it
    assert training == f"{published}.training"
    monkeypatch.setenv("LAB_S3", s3_store.credential)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_store.endpoint)
    reader = BundleStore(scratch / "reader", CredentialRegistry({"lab": "LAB_S3"}))
    fetched = reader.verify(reader.fetch(f"s3://{published}", credential_ref="lab").path)
    assert fetched.manifest.kind == "prediction" and fetched.manifest.counts.items == 569
    assert fetched.manifest.input.snapshot == source
