"""Job state on disk: one ``job.json`` per job, written atomically under a per-job file lock.

The local Compute is used by several processes at once (the Dagster daemon's sensor, run workers,
detached job workers), so its state lives in files, not in memory: every read-modify-write holds
``jobs/<job_id>/job.lock`` and ends in one atomic rename, and a reader never sees half a record.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import filelock
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from pipeline.bundle import leftovers
from pipeline.bundle.atomic import atomic_write_text
from pipeline.bundle.digest import sha256_bytes
from resources.compute.client import (
    _JOB_ID_RE,
    ComputeError,
    ComputeUnavailable,
    JobSpec,
    JobState,
    UnknownJob,
    check_job_id,
    utc_now,
)

JOB_FILE = "job.json"
LOCK_TIMEOUT_SECONDS = 30.0


class AttemptRecord(BaseModel):
    """One attempt of a job: the first run, or one resubmission of a PARTIAL version's items."""

    model_config = ConfigDict(extra="forbid")

    number: int = Field(ge=1)
    token: str  # random suffix that makes this attempt's version id unique across services
    idempotency_key: str | None = None
    from_version_id: str | None = None
    state: JobState = "QUEUED"
    pid: int | None = None
    version_id: str | None = None
    items: int | None = None  # items this attempt was asked to compute
    lost: int | None = None  # of those, lost to injected faults
    message: str | None = None
    created_at: AwareDatetime = Field(default_factory=utc_now)
    started_at: AwareDatetime | None = None
    finished_at: AwareDatetime | None = None


class JobRecord(BaseModel):
    """Everything Compute knows about one job; ``job.json`` is this model as JSON."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    spec: JobSpec
    #: credential_ref -> NAME of the environment variable holding its secret (never the secret)
    credential_env: dict[str, str] = Field(default_factory=dict)
    state: JobState = "QUEUED"
    attempts: list[AttemptRecord]
    versions: list[str] = Field(default_factory=list)
    outstanding: int = 0
    message: str | None = None
    status_errors_left: int = 0
    created_at: AwareDatetime = Field(default_factory=utc_now)
    updated_at: AwareDatetime = Field(default_factory=utc_now)

    @property
    def current(self) -> AttemptRecord:
        """The newest attempt."""
        return self.attempts[-1]

    def attempt(self, number: int) -> AttemptRecord:
        """Attempt ``number`` (1-based), or :class:`UnknownJob` naming the attempts that exist."""
        if not 1 <= number <= len(self.attempts):
            raise UnknownJob(
                f"job {self.job_id!r} has attempts 1..{len(self.attempts)}, not {number}"
            )
        return self.attempts[number - 1]


class JobStore:
    """The ``jobs/`` and ``keys/`` directories of a local Compute root."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.jobs_dir = self.root / "jobs"
        self.keys_dir = self.root / "keys"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.keys_dir.mkdir(parents=True, exist_ok=True)

    def job_dir(self, job_id: str) -> Path:
        """The directory holding ``job.json``, its lock and the workers' logs.

        Every path to a job goes through here, so the job id is checked here (one path segment).
        """
        return self.jobs_dir / check_job_id(job_id)

    def exists(self, job_id: str) -> bool:
        """Whether a job record exists."""
        return (self.job_dir(job_id) / JOB_FILE).is_file()

    def list(self) -> list[str]:
        """Ids of every recorded job, sorted."""
        names = (p.parent.name for p in self.jobs_dir.glob(f"*/{JOB_FILE}"))
        return sorted(n for n in names if _JOB_ID_RE.fullmatch(n))  # nothing else can be a job

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        try:
            with filelock.FileLock(path, timeout=LOCK_TIMEOUT_SECONDS):
                yield
        except filelock.Timeout:
            raise ComputeUnavailable(
                f"{path}: lock still held after {LOCK_TIMEOUT_SECONDS:.0f}s; try again"
            ) from None

    @contextlib.contextmanager
    def submission_lock(self) -> Iterator[None]:
        """Serialise job creation, so one idempotency key can never create two jobs."""
        with self._locked(self.root / "submit.lock"):
            yield

    def load(self, job_id: str) -> JobRecord:
        """Read a job's record (atomic writes mean no lock is needed to read a whole one)."""
        try:
            text = (self.job_dir(job_id) / JOB_FILE).read_text()
        except FileNotFoundError:
            raise UnknownJob(
                f"no job {job_id!r} under {self.jobs_dir} "
                f"(known: {', '.join(self.list()) or 'none'})"
            ) from None
        record = JobRecord.model_validate_json(text)
        if record.job_id != job_id:  # a record copied or planted under another name
            raise ComputeError(
                f"{self.job_dir(job_id) / JOB_FILE}: records job {record.job_id!r}, expected "
                f"{job_id!r}"
            )
        return record

    def create(self, record: JobRecord) -> None:
        """Write a new job's first record; fails if the job already exists."""
        d = self.job_dir(record.job_id)
        d.mkdir(parents=True, exist_ok=True)
        with self._locked(d / "job.lock"):
            atomic_write_text(d / JOB_FILE, record.model_dump_json(indent=2) + "\n", replace=False)

    @contextlib.contextmanager
    def edit(self, job_id: str) -> Iterator[JobRecord]:
        """Hold the job's lock, yield its record, and write it back atomically if no error."""
        d = self.job_dir(job_id)
        if not (d / JOB_FILE).is_file():
            self.load(job_id)  # raises UnknownJob with the known ids
        with self._locked(d / "job.lock"):
            record = self.load(job_id)
            yield record
            record.updated_at = utc_now()
            atomic_write_text(d / JOB_FILE, record.model_dump_json(indent=2) + "\n")

    def _key_path(self, key: str) -> Path:
        return self.keys_dir / f"{sha256_bytes(key.encode())}.json"

    def job_for_key(self, key: str) -> str | None:
        """The job a submission idempotency key already created, if any."""
        try:
            return json.loads(self._key_path(key).read_text())["job_id"]
        except FileNotFoundError:
            return None

    def remember_key(self, key: str, job_id: str) -> None:
        """Record that ``key`` created ``job_id`` (call under :meth:`submission_lock`)."""
        atomic_write_text(
            self._key_path(key), json.dumps({"key": key, "job_id": job_id}) + "\n", replace=False
        )


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (zombies of our own children count as exited)."""
    if not leftovers.pid_alive(pid):
        return False
    try:  # a zombie still answers kill(0); reap it if it is our child
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return _not_zombie(pid)
    return done == 0


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
