"""A Compute client of your own that only follows jobs: result bundles published to a folder.

Select it with ``LITHI_COMPUTE=examples.folder_compute:FolderCompute``, with
``FOLDER_COMPUTE_ROOT`` naming the folder and ``LITHI_JOB_ID`` the job. The Compute service, not
this client, publishes each result version of a job as a bundle folder under
``$FOLDER_COMPUTE_ROOT/<job_id>/`` (parts first, ``result-manifest.json`` last; a resubmission's
manifest names its parent). The state is read from the manifests. Only ``status`` and
``manifest_url`` are defined, so the pipeline never submits or resubmits through this client:
a PARTIAL version is trained on only with ``LITHI_TRAIN_ON_PARTIAL``. The contract, field by
field: docs/compute-client.md.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from pipeline.bundle import BundleError, IncompleteBundle, JobInfo, Manifest, read_manifest
from resources.compute.client import (
    ComputeClient,
    ComputeError,
    JobStatus,
    UnknownJob,
    check_job_id,
)

ROOT = "FOLDER_COMPUTE_ROOT"


class FolderCompute(ComputeClient):
    """Each job a folder under ``$FOLDER_COMPUTE_ROOT``, each published version a bundle in it."""

    def __init__(self) -> None:
        self.root = Path(os.environ[ROOT])  # built with no arguments: it reads its own setting

    def _versions(self, job_id: str) -> list[tuple[Path, Manifest, JobInfo]]:
        """Every published version of the job, oldest first: its folder, manifest and job."""
        folder = self.root / check_job_id(job_id)  # one safe path segment: never ../elsewhere
        if not folder.is_dir():
            raise UnknownJob(f"no job {job_id!r} under {self.root}")
        found = []
        for path in folder.iterdir():
            if path.name.startswith("."):
                continue  # hidden: a version still being staged
            try:
                m = read_manifest(path)
            except IncompleteBundle:
                continue  # no manifest yet: parts alone never mean a version is published
            except BundleError as e:  # one line; the sensor reports it and goes on
                raise ComputeError(f"job {job_id!r}: {e}") from None
            if m.job is None:
                raise ComputeError(f"job {job_id!r}: {path} is not a result bundle")
            found.append((path, m, m.job))
        return sorted(found, key=lambda v: (v[2].attempt, v[1].created_at))

    def status(self, job_id: str) -> JobStatus:
        """The latest version's manifest says the state; nothing published yet means running."""
        versions = self._versions(job_id)
        if not versions:
            changed = datetime.fromtimestamp((self.root / job_id).stat().st_mtime, UTC)
            return JobStatus(job_id=job_id, state="RUNNING", attempt=1, updated_at=changed)
        _, latest, job = versions[-1]
        return JobStatus(
            job_id=job_id,
            state=job.status,
            attempt=job.attempt,
            versions=[m.snapshot.version_id for _, m, _ in versions],
            latest_version_id=latest.snapshot.version_id,
            outstanding=latest.counts.outstanding or 0,
            updated_at=latest.created_at,
        )

    def manifest_url(self, job_id: str, version_id: str | None = None) -> str:
        """The version's bundle folder (the latest when ``version_id`` is None)."""
        for path, m, _ in reversed(self._versions(job_id)):
            if version_id in (None, m.snapshot.version_id):
                return str(path)
        raise UnknownJob(f"job {job_id!r} has no version {version_id or 'published yet'}")
