"""A Compute service behind a small client interface, and a faithful local implementation."""

from resources.compute.client import (
    ComputeClient,
    ComputeError,
    ComputeUnavailable,
    JobSpec,
    JobState,
    JobStatus,
    NotSupported,
)
from resources.compute.faults import FaultSpec

__all__ = [
    "ComputeClient",
    "ComputeError",
    "ComputeUnavailable",
    "FaultSpec",
    "JobSpec",
    "JobState",
    "JobStatus",
    "NotSupported",
]
