"""The chain on bundles in S3 (moto's server): trained from ``s3://``, published to ``s3://``.

Set up as the README's S3 variant does it: ``LITHI_BUNDLE_URL=s3://...`` with a registered
credential reference, the endpoint in ``AWS_ENDPOINT_URL_S3``, ``LITHI_PUBLISH_URL`` for the
output bundle. The canary: the access key and the secret appear in no file under the Dagster
home or the Lithi home (SQLite and PostgreSQL storage), no log line (DEBUG included, the storage
client's own), no run config or tag, and no command line the chain launches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets._metadata import plain
from pipeline.bundle.digest import sha256_bytes
from pipeline.bundle.manifest import JobInfo
from pipeline.bundle.stage import stage
from pipeline.bundle.verify import verify
from pipeline.defs.definitions import build_definitions
from pipeline.defs.instance import PROJECT_YAML, prepare_instance
from pipeline.defs.jobs import CHAIN_JOB_NAME
from pipeline.training.record import OutputRecord, read_record
from resources.bundle_store import BundleStore
from resources.compute.bundle_dir import BundleDirectory
from resources.compute.local import LocalCompute
from resources.credentials import CredentialRegistry
from resources.settings import LithiEnv
from tests.helpers.chain import sensor_tick
from tests.helpers.postgres import fresh_database, postgres_home
from tests.helpers.s3 import REF, SECRET_ENV

TRAINING = '{"auto_features": true, "epochs": 1}'
REFS = {REF: SECRET_ENV}


@pytest.fixture
def wine_v1(tmp_path, labelled_samples, s3) -> tuple[Path, str]:
    """The wine result bundle in a new bucket, as ``published/wine-v1``: (local copy, URL)."""
    compute = LocalCompute(labelled_samples.compute_root)
    local = Path(compute.manifest_url(labelled_samples.jobs["wine"]))
    return local, s3.upload_dir(local, f"s3://{s3.new_bucket()}/published/wine-v1")


def _env(tmp_path: Path, url: str, **kw) -> LithiEnv:
    return LithiEnv(
        home=tmp_path / "lithi",
        bundle_url=url,
        credential_refs=f"{REF}={SECRET_ENV}",
        credential_ref=REF,
        trainer_config=TRAINING,
        num_workers=0,
        **kw,
    )


def _newer_version(v1: Path, dest: Path) -> Path:
    """A second version naming ``v1`` as its parent (the same rows, one attempt later)."""
    snap = verify(v1)
    table = pa.concat_tables([pq.read_table(p) for p in snap.part_paths()])
    return stage(
        table,
        dest,
        id_field=snap.manifest.item_id_field,
        kind="result",
        job=JobInfo(
            job_id=snap.manifest.job.job_id,
            status="SUCCEEDED",
            attempt=2,
            parent_version_id=snap.identity.version_id,
        ),
        input=snap.manifest.input,
    ).root


def test_the_sensor_follows_a_newer_version_staged_beside_the_first_in_the_bucket(
    tmp_path, s3, wine_v1
):
    local, url = wine_v1
    defs = build_definitions(_env(tmp_path, url))
    v1 = verify(local).identity.version_id
    parent = url.rsplit("/", 1)[0]
    with dg.instance_for_test() as instance:
        first = sensor_tick(defs, instance, None)
        assert [r.tags["lithi/version_id"] for r in first.run_requests] == [v1]
        quiet = sensor_tick(defs, instance, first.cursor)
        assert quiet.run_requests == []
        v2_local = _newer_version(local, tmp_path / "v2")
        v2 = verify(v2_local).identity.version_id
        # a newer upload still under way (parts, no manifest yet) is not a version
        s3.fs().put_file(
            str(next(v2_local.glob("parts/*"))), f"{parent}/wine-v3/parts/part-00000.parquet"
        )
        s3.upload_dir(v2_local, f"{parent}/wine-v2")
        second = sensor_tick(defs, instance, quiet.cursor)
        assert [r.tags["lithi/version_id"] for r in second.run_requests] == [v2]
        assert second.run_requests[0].run_key == f"chain:{v1}:{v2}"
    lineage = BundleDirectory(url, BundleStore(tmp_path / "c", CredentialRegistry(REFS)), REF)
    assert lineage.manifest_url(v1) == f"{parent}/wine-v2"  # what the next chain run reads


@pytest.fixture(params=["sqlite", "postgres"])
def instance_home(request, tmp_path, monkeypatch) -> Iterator[tuple[Path, str | None]]:
    """A prepared Dagster home, SQLite or PostgreSQL-backed: (its folder, the database URL)."""
    home = tmp_path / "dagster_home"
    with contextlib.ExitStack() as stack:
        url = None
        if request.param == "postgres":
            url = stack.enter_context(fresh_database())
            env = postgres_home(home, url)
            monkeypatch.setenv("DAGSTER_POSTGRES_URL", env["DAGSTER_POSTGRES_URL"])
        else:
            home.mkdir()
            shutil.copy(PROJECT_YAML, home)
        prepare_instance(home)
        yield home, url


def _files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _database_text(url: str) -> str:
    """Every row of every table of the database, as text (what a dump would show)."""
    import psycopg2

    with contextlib.closing(psycopg2.connect(url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = [t for (t,) in cur.fetchall()]
        rows = []
        for table in tables:
            cur.execute(f'SELECT CAST(t AS text) FROM "{table}" t')
            rows += [r for (r,) in cur.fetchall()]
    assert "runs" in tables and rows  # the run really was stored there
    return "\n".join(rows)


def test_the_chain_trains_from_s3_publishes_to_s3_and_the_secret_is_nowhere(
    tmp_path, s3, wine_v1, instance_home, caplog
):
    local, url = wine_v1
    dagster_home, database = instance_home
    bucket = url.removeprefix("s3://").split("/")[0]
    env = _env(tmp_path, url, publish_url=f"s3://{bucket}/outputs", publish_credential_ref=REF)
    caplog.set_level(logging.DEBUG)  # botocore logs every request's headers at this level
    defs = build_definitions(env)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(instance=instance)
        assert result.success
        logs = "\n".join(str(e) for e in instance.all_logs(result.run_id))
        run = instance.get_run_by_id(result.run_id)

    # Trained on the bundle in S3, and the output bundle published there, manifest last.
    source = verify(local).identity
    output = result.asset_materializations_for_node("output_bundle")[0].metadata
    record = read_record(output["record"].value, OutputRecord)
    assert record.training.snapshot == source
    version = record.output.version_id
    published = f"s3://{bucket}/outputs/{version}"
    assert plain(output["published_url"]) == published == record.published_url
    reader = BundleStore(tmp_path / "reader", CredentialRegistry(REFS))
    fetched = reader.verify(reader.fetch(published, credential_ref=REF).path)
    assert fetched.identity == record.output
    assert fetched.manifest.input.snapshot == source
    # ...and the training artifacts beside it: the checkpoint the record hashes, both records.
    artifacts = f"{published}.training"
    assert record.published_training_url == artifacts
    fs = s3.fs()
    there = artifacts.removeprefix("s3://")
    for rel, sha in record.training.checkpoint.files.items():
        assert sha256_bytes(fs.cat_file(f"{there}/checkpoint/{rel}")) == sha
    training_record = Path(record.training_record).read_bytes()
    assert fs.cat_file(f"{there}/training-record.json") == training_record
    assert fs.cat_file(f"{there}/record.json") == Path(output["record"].value).read_bytes()

    for needle in (s3.access_key, s3.secret):
        assert _files_containing(tmp_path, needle.encode()) == []  # both homes are in tmp_path
        assert needle not in logs and needle not in caplog.text
        assert needle not in json.dumps(run.run_config) and needle not in json.dumps(run.tags)
        if database is not None:
            assert needle not in _database_text(database)
    # The checks above would see it: the canary is findable where it is put.
    (dagster_home / "probe").write_text(f"x{s3.secret}")
    assert _files_containing(tmp_path, s3.secret.encode()) == [dagster_home / "probe"]
    assert any("Sending http request" in r.getMessage() for r in caplog.records)


class RecordingPipes(dg.PipesSubprocessClient):
    """The Pipes client, keeping every command line it launches (torchrun's, which it hands on
    to each rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[list[str]] = []

    def run(self, **kwargs):
        """Record the command, then launch it as the real client does."""
        self.commands.append([str(a) for a in kwargs["command"]])
        return super().run(**kwargs)


def test_two_torchrun_ranks_train_from_s3_and_no_command_line_holds_the_secret(
    tmp_path, s3, wine_v1
):
    local, url = wine_v1
    pipes = RecordingPipes()
    defs = build_definitions(_env(tmp_path, url, world_size=2), pipes_subprocess_client=pipes)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(instance=instance)
    assert result.success
    meta = result.asset_materializations_for_node("training_run")[0].metadata
    record = read_record(meta["record"].value)
    assert record.snapshot == verify(local).identity and record.world_size == 2
    assert record.reconciliation.ok and record.reconciliation.owners == 2
    assert meta["pipes/ranks_bytes_hashed"].value == 0  # the ranks trusted the fetched cache
    (command,) = pipes.commands
    assert "torch.distributed.run" in command and "--bundle" in command
    for needle in (s3.access_key, s3.secret):
        assert not [arg for arg in command if needle in arg]
