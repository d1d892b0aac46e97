"""The Compute client interface and its data types: what the pipeline may ask of a batch service.

Everything the sensor, the jobs and the assets need from Compute goes through
:class:`ComputeClient`, so the local service and a remote one are interchangeable and tests can
run the real local one. Errors are split by what the caller should do: retry later
(:class:`ComputeUnavailable`) or stop and report (:class:`ComputeError`).
"""

from __future__ import annotations

import abc
import re
from datetime import UTC, datetime
from typing import ClassVar, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from resources.compute.faults import FaultSpec

JobState = Literal["QUEUED", "RUNNING", "SUCCEEDED", "PARTIAL", "FAILED"]
#: States after which nothing more happens until the caller acts (resubmits a PARTIAL version).
FINAL_STATES: frozenset[str] = frozenset({"SUCCEEDED", "PARTIAL", "FAILED"})

#: A job id is one safe path segment: the local Compute keeps ``jobs/<job_id>/`` and
#: ``results/<job_id>/``. The one rule, applied at submit and at every other entry point.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)


class ComputeUnavailable(Exception):
    """Compute could not answer right now (unreachable, overloaded, 5xx): try again later."""


class ComputeError(Exception):
    """Compute refused the request for good (unknown job, invalid resubmission, bad spec)."""


class UnknownJob(ComputeError):
    """No job with that id exists on this Compute service."""


class InvalidJobId(UnknownJob):
    """A job id that is not one safe path segment (``../x``, ``a/b``, empty): no job has it."""


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` if it follows :data:`JOB_ID_PATTERN`, else raise :class:`InvalidJobId`.

    Called wherever a job id enters (status, resubmit, results, manifest_url, the worker), so an
    id like ``../../outside/evil`` can never reach a path outside the Compute root.
    """
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise InvalidJobId(
            f"job id {job_id!r:.80} is not valid: expected 1-128 characters from [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return job_id


class InvalidResubmission(ComputeError):
    """The version named for resubmission is unknown, not PARTIAL, not the latest, or busy."""


class JobSpec(BaseModel):
    """One job: label the items of a staged input bundle against a labelled reference bundle.

    ``idempotency_key`` makes submission safe to retry: the same key always names the same job.
    ``labeller`` chooses the method (``knn``, or ``centroid``, whose cost is linear in the
    items); ``k`` and ``abstain_margin`` parametrise it; ``rows_per_part`` sizes the result parts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_url: str = Field(min_length=1)
    reference_url: str = Field(min_length=1)
    credential_ref: str | None = None
    job_id: str | None = Field(default=None, pattern=JOB_ID_PATTERN)
    idempotency_key: str | None = Field(default=None, min_length=1)
    faults: FaultSpec = FaultSpec()
    labeller: Literal["knn", "centroid"] = "knn"
    k: int = Field(default=7, ge=1)
    abstain_margin: float = Field(default=0.3, ge=0.0, le=1.0)
    rows_per_part: int = Field(default=256, ge=1)


class JobStatus(BaseModel):
    """A job as Compute sees it now: its state, its attempts and its published result versions.

    ``versions`` are oldest first; ``outstanding`` is the outstanding count of the latest version
    (what a resubmission would run). ``running_attempt`` is set while an attempt is queued or runs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    state: JobState
    attempt: int = Field(ge=1)
    running_attempt: int | None
    versions: list[str]
    latest_version_id: str | None
    latest_manifest_url: str | None
    outstanding: int = Field(ge=0)
    message: str | None
    updated_at: AwareDatetime

    @property
    def is_final(self) -> bool:
        """Whether the job waits for its caller (SUCCEEDED, PARTIAL or FAILED)."""
        return self.state in FINAL_STATES


class ComputeClient(abc.ABC):
    """What the pipeline may ask of Compute: submit, watch, resubmit outstanding items, locate.

    Implement it to plug in your own Compute service and select it by import path
    (``LITHI_COMPUTE=my_pkg.compute:MyClient``): the class is constructed with no arguments, so
    it reads its own endpoint and credential references (never a secret in configuration).
    """

    #: Whether :meth:`resubmit` can run a PARTIAL version's outstanding items (the sensor asks
    #: for nothing it cannot do).
    can_resubmit: ClassVar[bool] = True

    @abc.abstractmethod
    def submit(self, spec: JobSpec) -> str:
        """Start a job and return its id; a repeated ``spec.idempotency_key`` returns that id."""

    @abc.abstractmethod
    def status(self, job_id: str) -> JobStatus:
        """The job's current state; raises :class:`ComputeUnavailable` on transient errors."""

    @abc.abstractmethod
    def resubmit(self, job_id: str, *, from_version_id: str, idempotency_key: str) -> int:
        """Run only the outstanding items of PARTIAL ``from_version_id``; return the attempt.

        The same ``idempotency_key`` returns the same attempt and starts nothing new, so a caller
        that crashed after resubmitting but before recording it can simply ask again.
        """

    @abc.abstractmethod
    def list_jobs(self) -> list[str]:
        """Ids of every job this service knows, sorted."""

    @abc.abstractmethod
    def latest_job(self) -> str | None:
        """The most recently submitted job's id (what the chain follows by default), or None."""

    @abc.abstractmethod
    def manifest_url(self, job_id: str, version_id: str | None = None) -> str:
        """Location of a published result bundle (the latest one when ``version_id`` is None)."""


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC (every persisted timestamp uses it)."""
    return datetime.now(UTC)
