"""The ComputeClient contract: two methods required, the rest optional and refused by name, and
``manifest_url`` answered as a folder whether a client names the folder or the manifest file."""

from __future__ import annotations

import pytest

from resources.bundle_store import BundleStore
from resources.compute.bundle_dir import BundleDirectory
from resources.compute.client import (
    ComputeClient,
    JobSpec,
    JobStatus,
    NotSupported,
    bundle_folder,
    utc_now,
)
from resources.compute.local import LocalCompute
from tests.helpers.refusals import one_line_refusal


class Follower(ComputeClient):
    """The least a client defines: a job still running, and its bundle at ``where``."""

    def __init__(self, where: str = "/results/job-1/v1") -> None:
        self.where = where

    def status(self, job_id: str) -> JobStatus:
        return JobStatus(job_id=job_id, state="RUNNING", attempt=1, updated_at=utc_now())

    def manifest_url(self, job_id: str, version_id: str | None = None) -> str:
        return self.where


class Resubmitter(Follower):
    """A follower that can also run outstanding items."""

    def resubmit(self, job_id: str, *, from_version_id: str, idempotency_key: str) -> int:
        return 2


@pytest.mark.parametrize(
    ("url", "folder"),
    [
        ("/results/job-1/v1", "/results/job-1/v1"),
        ("/results/job-1/v1/", "/results/job-1/v1"),
        ("/results/job-1/v1/result-manifest.json", "/results/job-1/v1"),
        ("s3://bucket/job-1/v1/result-manifest.json", "s3://bucket/job-1/v1"),
        ("file:///results/job-1/v1/result-manifest.json", "file:///results/job-1/v1"),
        ("s3://bucket/job-1/result-manifest.json.d", "s3://bucket/job-1/result-manifest.json.d"),
    ],
)
def test_a_manifest_url_is_read_as_the_bundle_folder(url, folder):
    assert bundle_folder(url) == folder
    assert Follower(url).bundle_url("job-1", "v1") == folder


def test_only_status_and_manifest_url_are_required():
    client = Follower()
    status = client.status("job-1")  # the defaults: nothing published yet
    assert (status.versions, status.latest_version_id, status.outstanding) == ([], None, 0)
    assert client.latest_job() is None  # the chain then asks for LITHI_JOB_ID
    name = f"Compute client {__name__}:Follower"
    spec = JobSpec(input_url="in", reference_url="ref")
    assert one_line_refusal(NotSupported, client.submit, spec) == (
        f"{name}: defines no submit; it only follows jobs"
    )
    refused = one_line_refusal(
        NotSupported,
        lambda: client.resubmit("job-1", from_version_id="v1", idempotency_key="k"),
    )
    assert refused == f"{name}: defines no resubmit; it only follows jobs"
    assert "defines no list_jobs" in one_line_refusal(NotSupported, client.list_jobs)


def test_can_resubmit_is_whether_the_client_defines_resubmit(tmp_path):
    assert not Follower().can_resubmit
    assert Resubmitter().can_resubmit
    assert LocalCompute(tmp_path / "compute", "inline").can_resubmit
    assert not BundleDirectory(str(tmp_path), BundleStore(tmp_path / "cache")).can_resubmit
