"""The local Compute: a real batch service on this machine, with its state on disk.

Jobs run over staged input bundles and publish result bundles in format v1 under
``root/results/<job_id>/<version_id>/``. Job state lives in ``root/jobs/<job_id>/job.json``, so
the Dagster daemon, run workers and the job processes themselves all see the same jobs. With
``executor="subprocess"`` each attempt runs as a detached process
(``python -m resources.compute.local.worker``, its output in the job directory); ``"inline"``
runs it synchronously, for tests.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pipeline.bundle import format as fmt
from pipeline.bundle.manifest import parse_manifest
from resources.compute.client import (
    ComputeClient,
    ComputeError,
    ComputeUnavailable,
    InvalidResubmission,
    JobSpec,
    JobStatus,
    UnknownJob,
    check_job_id,
)
from resources.compute.local.jobstore import AttemptRecord, JobRecord, JobStore, pid_alive
from resources.compute.local.worker import results_dir, run_attempt
from resources.credentials import CredentialError, CredentialRegistry

Executor = Literal["subprocess", "inline"]
_PROJECT_ROOT = Path(__file__).resolve().parents[3]  # holds the resources package
_RUNNING = ("QUEUED", "RUNNING")


class LocalCompute(ComputeClient):
    """A :class:`ComputeClient` whose jobs run on this machine and whose state is on disk.

    ``credentials`` registers the ``credential_ref`` names a spec may use to read its input; a
    job records only the ref's environment variable NAME, and the worker reads the secret from
    its environment at download time.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        executor: Executor = "subprocess",
        *,
        credentials: CredentialRegistry | None = None,
        python: str | None = None,
    ) -> None:
        if executor not in ("subprocess", "inline"):
            raise ValueError(f"executor must be 'subprocess' or 'inline', found {executor!r}")
        self.root = Path(root).resolve()
        self.executor = executor
        self.credentials = credentials or CredentialRegistry()
        self.python = python or sys.executable
        self.jobs = JobStore(self.root)
        self._children: list[subprocess.Popen] = []

    # -- submit ------------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> str:
        """Create a job for ``spec`` and start its first attempt; idempotent per key and job id."""
        with self.jobs.submission_lock():
            if spec.idempotency_key and (existing := self.jobs.job_for_key(spec.idempotency_key)):
                return existing
            job_id = spec.job_id or f"job-{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"
            if self.jobs.exists(job_id):
                if self.jobs.load(job_id).spec == spec:
                    return job_id  # the same explicit job submitted again
                raise ComputeError(
                    f"job {job_id!r} already exists with a different spec; choose another job_id"
                )
            credential_env: dict[str, str] = {}
            if spec.credential_ref is not None:
                try:
                    credential_env = {
                        spec.credential_ref: self.credentials.env_var(spec.credential_ref)
                    }
                except CredentialError as e:
                    raise ComputeError(str(e)) from None
            self.jobs.create(
                JobRecord(
                    job_id=job_id,
                    spec=spec,
                    credential_env=credential_env,
                    attempts=[AttemptRecord(number=1, token=secrets.token_hex(4))],
                    status_errors_left=spec.faults.transient_status_errors,
                    message="attempt 1 queued",
                )
            )
            if spec.idempotency_key:
                self.jobs.remember_key(spec.idempotency_key, job_id)
        self._launch(job_id, 1)
        return job_id

    def resubmit(self, job_id: str, *, from_version_id: str, idempotency_key: str) -> int:
        """Run only the outstanding items of PARTIAL ``from_version_id`` as a new attempt."""
        check_job_id(job_id)
        try:
            fmt.check_version_id(from_version_id, what="from_version_id")
        except ValueError as e:
            raise InvalidResubmission(f"job {job_id!r}: {e}") from None
        with self.jobs.edit(job_id) as rec:
            for a in rec.attempts:
                if a.idempotency_key == idempotency_key:
                    if a.from_version_id != from_version_id:
                        raise InvalidResubmission(
                            f"idempotency key {idempotency_key!r} was used for version "
                            f"{a.from_version_id}, not {from_version_id}"
                        )
                    return a.number
            if rec.state in _RUNNING:
                raise InvalidResubmission(
                    f"job {job_id!r} attempt {rec.current.number} is still {rec.state}; "
                    "resubmit when it has finished"
                )
            if from_version_id not in rec.versions:
                raise InvalidResubmission(
                    f"job {job_id!r} has no version {from_version_id!r} "
                    f"(versions: {', '.join(rec.versions) or 'none'})"
                )
            if from_version_id != rec.versions[-1]:
                raise InvalidResubmission(
                    f"version {from_version_id} of job {job_id!r} is not the latest "
                    f"({rec.versions[-1]}); only the latest version's outstanding items can be "
                    "resubmitted"
                )
            bundle = results_dir(self.root, job_id) / from_version_id
            manifest = parse_manifest((bundle / fmt.MANIFEST_NAME).read_bytes())
            if not manifest.is_partial:
                raise InvalidResubmission(
                    f"version {from_version_id} of job {job_id!r} is {manifest.job.status}, "
                    "expected PARTIAL: only outstanding items can be resubmitted"
                )
            number = len(rec.attempts) + 1
            rec.attempts.append(
                AttemptRecord(
                    number=number,
                    token=secrets.token_hex(4),
                    idempotency_key=idempotency_key,
                    from_version_id=from_version_id,
                    items=manifest.counts.outstanding,
                )
            )
            rec.state = "QUEUED"
            rec.message = (
                f"attempt {number} queued: {manifest.counts.outstanding} outstanding items of "
                f"{from_version_id}"
            )
        self._launch(job_id, number)
        return number

    def _launch(self, job_id: str, number: int) -> None:
        if self.executor == "inline":
            try:
                run_attempt(self.root, job_id, number)
            except Exception:  # recorded as FAILED in job.json; status() reports it
                pass
            return
        log = self.jobs.job_dir(job_id) / f"attempt-{number:03d}.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
        )
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [
                    self.python,
                    "-m",
                    "resources.compute.local.worker",
                    str(self.root),
                    job_id,
                    str(number),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # detached: survives this process and its signals
                cwd=self.root,
                env=env,
            )
        self._children.append(proc)
        with self.jobs.edit(job_id) as rec:
            att = rec.attempt(number)
            if att.pid is None and att.state in _RUNNING:
                att.pid = proc.pid

    # -- observe -----------------------------------------------------------------------------

    def status(self, job_id: str) -> JobStatus:
        """The job's current state; the first ``faults.transient_status_errors`` calls fail."""
        check_job_id(job_id)
        self._children = [p for p in self._children if p.poll() is None]  # reap finished ones
        rec = self.jobs.load(job_id)
        if rec.status_errors_left > 0 or self._worker_died(rec):
            with self.jobs.edit(job_id) as rec:
                if rec.status_errors_left > 0:
                    rec.status_errors_left -= 1
                    left = rec.status_errors_left
                else:
                    left = None
                    if self._worker_died(rec):
                        att = rec.current
                        msg = (
                            f"attempt {att.number} failed: worker process {att.pid} exited "
                            "without reporting (crashed or killed)"
                        )
                        att.state, att.message = "FAILED", msg
                        rec.state, rec.message = "FAILED", msg
            if left is not None:
                raise ComputeUnavailable(
                    f"local Compute status of {job_id!r}: injected transient error "
                    f"({left} more to come)"
                )
        return self._to_status(rec)

    @staticmethod
    def _worker_died(rec: JobRecord) -> bool:
        att = rec.current
        return rec.state in _RUNNING and att.pid is not None and not pid_alive(att.pid)

    def _to_status(self, rec: JobRecord) -> JobStatus:
        latest = rec.versions[-1] if rec.versions else None
        return JobStatus(
            job_id=rec.job_id,
            state=rec.state,
            attempt=len(rec.attempts),
            running_attempt=rec.current.number if rec.state in _RUNNING else None,
            versions=list(rec.versions),
            latest_version_id=latest,
            latest_manifest_url=self._url(rec.job_id, latest) if latest else None,
            outstanding=rec.outstanding,
            message=rec.message,
            updated_at=rec.updated_at,
        )

    def list_jobs(self) -> list[str]:
        """Ids of every job under this root, sorted."""
        return self.jobs.list()

    def latest_job(self) -> str | None:
        """The job with the newest ``created_at`` (ties broken by id), or None if there is none."""
        records = [self.jobs.load(j) for j in self.jobs.list()]
        return max(records, key=lambda r: (r.created_at, r.job_id)).job_id if records else None

    def manifest_url(self, job_id: str, version_id: str | None = None) -> str:
        """The local path of a published result bundle (the latest when ``version_id`` is None)."""
        check_job_id(job_id)
        if version_id is not None:
            try:
                fmt.check_version_id(version_id)
            except ValueError as e:
                raise UnknownJob(f"job {job_id!r}: {e}") from None
        rec = self.jobs.load(job_id)
        if version_id is None:
            if not rec.versions:
                raise ComputeError(f"job {job_id!r} has published no version yet ({rec.state})")
            version_id = rec.versions[-1]
        elif version_id not in rec.versions:
            raise UnknownJob(
                f"job {job_id!r} has no version {version_id!r} "
                f"(versions: {', '.join(rec.versions) or 'none'})"
            )
        return self._url(job_id, version_id)

    def _url(self, job_id: str, version_id: str) -> str:
        return str(results_dir(self.root, job_id) / fmt.check_version_id(version_id))

    def wait(self, job_id: str, *, timeout: float = 60.0, poll: float = 0.05) -> JobStatus:
        """Poll until the job is SUCCEEDED, PARTIAL or FAILED; transient errors are retried.

        Raises ``TimeoutError`` naming the last state seen when ``timeout`` seconds pass.
        """
        deadline = time.monotonic() + timeout
        last: JobStatus | None = None
        while True:
            try:
                last = self.status(job_id)
                if last.is_final:
                    return last
            except ComputeUnavailable:
                pass
            if time.monotonic() > deadline:
                seen = last.state if last else "no answer"
                raise TimeoutError(f"job {job_id!r} not finished after {timeout}s (last: {seen})")
            time.sleep(poll)
