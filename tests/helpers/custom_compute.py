"""A user's own Compute client, chosen by import path (``LITHI_COMPUTE=...:StudioCompute``).

It stands in for a client of a remote service the way a user would write one: a
:class:`~resources.compute.client.ComputeClient` subclass built with no arguments, reading its
own endpoint from its own environment variable. Here the "service" is a local Compute root.
"""

from __future__ import annotations

import os

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


class NotAClient:
    """Something that is not a ComputeClient."""
