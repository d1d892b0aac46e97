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
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from pipeline.bundle.format import MANIFEST_NAME
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


class NotSupported(ComputeError):
    """The client does not offer this call: it only follows jobs (see :class:`ComputeClient`)."""


class JobStatus(BaseModel):
    """A job as Compute sees it now: its state, its attempts and its published result versions.

    Field by field, with who reads it (docs/compute-client.md has the same as a table); the
    defaults describe a job that has published nothing yet:

    - ``job_id``: the id asked about, echoed.
    - ``state``: ``QUEUED``/``RUNNING`` while an attempt is waiting or running (the sensor
      waits); ``SUCCEEDED`` when the latest version is complete (the sensor and the schedule
      request the chain for it); ``PARTIAL`` when the latest version was published with items
      outstanding (the sensor resubmits them, if the client can, or trains on the accepted parts
      only with ``LITHI_TRAIN_ON_PARTIAL``); ``FAILED`` when nothing more will come (nothing is
      trained, even on an earlier version).
    - ``attempt``: how many attempts the job has had so far, the running one included (1 for the
      first run, one more per resubmission). The sensor's PARTIAL policy compares it with
      ``LITHI_MAX_ATTEMPTS`` and grows its delay with it; runs are tagged ``lithi/attempt``.
    - ``running_attempt``: the number of the attempt that is queued or running, ``None`` once the
      job is final. Informational: nothing in the pipeline reads it.
    - ``versions``: the ids of every result version published so far, oldest first; each must be
      accepted by :meth:`ComputeClient.manifest_url`. The sensor records each as an observation
      of ``compute_versions`` the first time it sees it.
    - ``latest_version_id``: the last of ``versions`` (``None`` before the first): what the
      sensor and the schedule pin a chain run to, and what ``result_manifest`` reads when its
      run config names no version.
    - ``latest_manifest_url``: ``manifest_url(job_id, latest_version_id)``, or ``None``.
      Informational: nothing in the pipeline reads it.
    - ``outstanding``: how many items the latest version left outstanding (what a resubmission
      would run); 0 when complete. Shown in the sensor's log and skip reasons, never decided on.
    - ``message``: a line for people (why an attempt failed); the sensor's skip reason for a
      FAILED job quotes it.
    - ``updated_at``: when the job last changed, timezone-aware. Informational.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    state: JobState
    attempt: int = Field(ge=1)
    running_attempt: int | None = None
    versions: list[str] = Field(default_factory=list)
    latest_version_id: str | None = None
    latest_manifest_url: str | None = None
    outstanding: int = Field(default=0, ge=0)
    message: str | None = None
    updated_at: AwareDatetime

    @property
    def is_final(self) -> bool:
        """Whether the job waits for its caller (SUCCEEDED, PARTIAL or FAILED)."""
        return self.state in FINAL_STATES


def bundle_folder(url: str) -> str:
    """``url`` as the folder of a bundle: a URL naming ``result-manifest.json`` itself becomes
    the folder that holds it; any other URL is returned without a trailing slash."""
    url = url.rstrip("/")
    head, sep, name = url.rpartition("/")
    return head if sep and head and name == MANIFEST_NAME else url


class ComputeClient(abc.ABC):
    """What the pipeline may ask of Compute: watch a job, locate its results, resubmit.

    Implement it to plug in your own Compute service and select it by import path
    (``LITHI_COMPUTE=my_pkg.compute:MyClient``): the class is constructed with no arguments, so
    it reads its own endpoint and credential references (never a secret in configuration).

    Only :meth:`status` and :meth:`manifest_url` must be defined: a client that only follows
    jobs someone else submits stops there. :meth:`resubmit` is what lets the sensor run a
    PARTIAL version's outstanding items; :meth:`latest_job` what picks the job when
    ``LITHI_JOB_ID`` is unset. :meth:`submit` and :meth:`list_jobs` are never called by the
    pipeline (the demo submits to the local Compute). What a client leaves undefined is refused
    with :class:`NotSupported`. ``examples/folder_compute.py`` is a whole client in ~50 lines.
    """

    @property
    def can_resubmit(self) -> bool:
        """Whether :meth:`resubmit` can run a PARTIAL version's outstanding items: true when the
        class defines it. The sensor asks for nothing the client cannot do, and says so."""
        return type(self).resubmit is not ComputeClient.resubmit

    def _unsupported(self, call: str) -> NotSupported:
        return NotSupported(f"{describe(self)}: defines no {call}; it only follows jobs")

    @abc.abstractmethod
    def status(self, job_id: str) -> JobStatus:
        """The job's current state (see :class:`JobStatus`, field by field).

        Called by the sensor every tick for each watched job, by the schedule, and by
        ``result_manifest`` when a chain run starts. Raise :class:`ComputeUnavailable` when the
        service cannot answer now (the tick says so and tries again), :class:`UnknownJob` for a
        job it does not know.
        """

    @abc.abstractmethod
    def manifest_url(self, job_id: str, version_id: str | None = None) -> str:
        """The folder of a published result version: where ``result-manifest.json`` and its parts
        are (a path, ``file://``, ``s3://``... any fsspec URL), the latest when ``version_id`` is
        None.

        Despite its name it names the folder, not the manifest file; a URL that ends in
        ``/result-manifest.json`` is accepted too and read as its folder (:meth:`bundle_url`).
        Called for every version in :attr:`JobStatus.versions` (the sensor reads each manifest
        once) and for the version a chain run is pinned to. Raise :class:`UnknownJob` for a
        version the job does not have.
        """

    def bundle_url(self, job_id: str, version_id: str | None = None) -> str:
        """What the pipeline reads a version from: :meth:`manifest_url`'s answer, as a folder."""
        return bundle_folder(self.manifest_url(job_id, version_id))

    def latest_job(self) -> str | None:
        """The job the chain follows when ``LITHI_JOB_ID`` and ``LITHI_WATCH_JOBS`` are unset:
        the most recently submitted one, or None. Optional: by default None, and the chain then
        asks for ``LITHI_JOB_ID``."""
        return None

    def resubmit(self, job_id: str, *, from_version_id: str, idempotency_key: str) -> int:
        """Run only the outstanding items of PARTIAL ``from_version_id``; return the attempt.

        Called only by the ``resubmit_outstanding_job`` run the sensor requests for a PARTIAL
        version (after ``LITHI_RESUBMIT_DELAY_SECONDS``, up to ``LITHI_MAX_ATTEMPTS``). The same
        ``idempotency_key`` must return the same attempt and start nothing new, so a run that
        crashed after resubmitting but before recording it can simply ask again. When it is done,
        :meth:`status` reports the newer version (naming ``from_version_id`` as its parent).
        Optional: a client without it is never asked (:attr:`can_resubmit` is false).
        """
        raise self._unsupported("resubmit")

    def submit(self, spec: JobSpec) -> str:
        """Start a job and return its id; a repeated ``spec.idempotency_key`` returns that id.

        Optional, and never called by the pipeline (the sensor, the schedule, the assets and the
        jobs only follow jobs); the demo and the benchmarks submit to the local Compute.
        """
        raise self._unsupported("submit")

    def list_jobs(self) -> list[str]:
        """Ids of every job this service knows, sorted. Optional; the pipeline never calls it."""
        raise self._unsupported("list_jobs")


def describe(client: ComputeClient) -> str:
    """How messages name a client: by its import path, the form ``LITHI_COMPUTE`` takes."""
    cls = type(client)
    return f"Compute client {cls.__module__}:{cls.__qualname__}"


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC (every persisted timestamp uses it)."""
    return datetime.now(UTC)
