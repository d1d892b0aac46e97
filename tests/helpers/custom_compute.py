"""A user's own Compute client, chosen by import path (``LITHI_COMPUTE=...:StudioCompute``).

It stands in for a client of a remote service the way a user would write one: a
:class:`~resources.compute.client.ComputeClient` subclass built with no arguments, reading its
own endpoint from its own environment variable. Here the "service" is a local Compute root.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.bundle.format import MANIFEST_NAME
from resources.compute.client import ComputeClient, JobStatus
from resources.compute.local import LocalCompute

ENDPOINT = "STUDIO_COMPUTE_ROOT"
CALLS: list[str] = []


class StudioCompute(LocalCompute):
    """The local Compute at ``$STUDIO_COMPUTE_ROOT``, counting the calls the pipeline makes."""

    def __init__(self) -> None:
        super().__init__(os.environ[ENDPOINT], "inline")

    def status(self, job_id: str):
        CALLS.append(f"status {job_id}")
        return super().status(job_id)


class FollowingCompute(ComputeClient):
    """A client that only follows jobs: ``status`` and ``manifest_url``, nothing else defined.

    The jobs run on the local Compute at ``$STUDIO_COMPUTE_ROOT``; this client never submits or
    resubmits, the way a client of a service that someone else submits to would not.
    """

    def __init__(self) -> None:
        self.service = LocalCompute(os.environ[ENDPOINT], "inline")

    def status(self, job_id: str) -> JobStatus:
        return self.service.status(job_id)

    def manifest_url(self, job_id: str, version_id: str | None = None) -> str:
        return self.service.manifest_url(job_id, version_id)


class ManifestFileCompute(FollowingCompute):
    """A follower whose ``manifest_url`` names the manifest file rather than its folder."""

    def manifest_url(self, job_id: str, version_id: str | None = None) -> str:
        return str(Path(super().manifest_url(job_id, version_id)) / MANIFEST_NAME)


class NotAClient:
    """Something that is not a ComputeClient."""
