"""What to do about a Compute job, decided as a pure function of its status, a cursor and a clock.

The sensor (``pipeline.defs.sensor``) is thin Dagster wiring around :func:`decide`; keeping the
decision pure makes every transition (SUCCEEDED, PARTIAL with back-off, attempts exhausted,
FAILED, newer manifest) testable without a Dagster instance, and keeps sensor ticks free of side
effects: a decision only *asks* for work (a chain run, a resubmission run), it never does it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from pydantic import BaseModel, Field

from resources.compute.client import JobState, JobStatus
from resources.settings import Policy


class JobCursor(BaseModel):
    """What the sensor already did for one job; the run keys make it safe even if this is lost."""

    chain_requested: list[str] = Field(default_factory=list)
    resubmit_requested: dict[str, float] = Field(default_factory=dict)  # version -> when
    first_seen: dict[str, float] = Field(default_factory=dict)  # version -> when
    resubmit_retries: dict[str, int] = Field(default_factory=dict)  # version -> retries requested
    observed: list[str] = Field(default_factory=list)  # versions recorded as observations


class Cursor(BaseModel):
    """The sensor cursor: per-job state, serialised as JSON."""

    jobs: dict[str, JobCursor] = Field(default_factory=dict)
    #: The state table the last tick logged: a tick logs its own only when it differs, so a
    #: daemon ticking every few seconds over unchanged jobs writes nothing.
    logged: str = ""
    #: What ``model_is_current`` last reported (the model's version and the newest complete
    #: ones): the sensor reports it again only when that changes.
    currency: str = ""

    def to_json(self) -> str:
        """Serialise for ``SensorResult(cursor=...)``."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | None) -> Cursor:
        """Parse a cursor; a missing cursor is an empty one (run keys still dedupe)."""
        return cls.model_validate_json(text) if text else cls()


@dataclass(frozen=True)
class Observed:
    """What the Compute side said about a job (a plain view of ``JobStatus``)."""

    job_id: str
    state: JobState
    attempt: int
    latest_version_id: str | None
    outstanding: int = 0
    message: str | None = None
    #: Runs of the resubmission job for ``latest_version_id``: how many failed, whether any is
    #: still queued or running (read from the Dagster instance by the sensor).
    resubmit_failures: int = 0
    resubmit_active: bool = False
    #: Whether the Compute client can run the outstanding items at all, and how it is named.
    can_resubmit: bool = True
    client: str = "the Compute client"
    #: Runs of the chain for ``latest_version_id`` (retries included): how many failed, whether
    #: one is queued or running, whether one succeeded (read from the instance by the sensor).
    chain_failures: int = 0
    chain_active: bool = False
    chain_succeeded: bool = False

    @property
    def chain_said(self) -> str:
        """What became of the chain run already requested for the latest version, as the end
        of a sentence (empty when the instance knows of no run yet)."""
        if self.chain_succeeded:
            return "; its chain run succeeded"
        if self.chain_active:
            return "; its chain run is queued or running"
        if self.chain_failures:
            return (
                f"; its chain FAILED ({self.chain_failures} run(s), retries included), and the "
                "sensor requests a version once: re-execute the failed run once its cause is "
                "fixed"
            )
        return ""

    @classmethod
    def of(cls, job_id: str, status: JobStatus, **read: Any) -> Observed:
        """``status`` as the policy sees it (its fields of the names above) for ``job_id``;
        ``read`` is what the sensor read beside it (the ``resubmit_*`` runs, the client)."""
        viewed = {f.name for f in fields(cls)} & set(JobStatus.model_fields) - {"job_id"}
        return cls(job_id=job_id, **{f: getattr(status, f) for f in viewed}, **read)


@dataclass(frozen=True)
class Action:
    """One thing the sensor should request: a chain rebuild or a resubmission, with its run key."""

    kind: Literal["chain", "resubmit"]
    job_id: str
    version_id: str
    attempt: int
    allow_partial: bool = False
    retry: int = 0

    @property
    def run_key(self) -> str:
        """Unique per (what, job, version, retry): repeated ticks never launch it twice."""
        suffix = ":partial" if self.allow_partial else ""
        if self.retry:
            suffix += f":retry{self.retry}"
        return f"{self.kind}:{self.job_id}:{self.version_id}{suffix}"


@dataclass
class Decision:
    """The actions to request and, where nothing is requested, why."""

    actions: list[Action] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def decide(observed: Observed, cursor: JobCursor, policy: Policy, now: float) -> Decision:
    """Decide what one job needs now, updating ``cursor`` in place with what was requested."""
    job, v = observed.job_id, observed.latest_version_id
    d = Decision()
    if observed.state in ("QUEUED", "RUNNING"):
        d.reasons.append(f"{job}: attempt {observed.attempt} is {observed.state.lower()}")
        return d
    if observed.state == "FAILED" or v is None:
        d.reasons.append(
            f"{job}: FAILED ({observed.message or 'no result bundle'}); nothing to train on"
        )
        return d
    if observed.state == "SUCCEEDED":
        if v in cursor.chain_requested:
            d.reasons.append(
                f"{job}: version {v} is complete and already requested{observed.chain_said}"
            )
        else:
            cursor.chain_requested.append(v)
            d.actions.append(Action("chain", job, v, observed.attempt))
        return d
    # PARTIAL: resubmit the outstanding items once per version, with a growing delay.
    cursor.first_seen.setdefault(v, now)
    if now < cursor.first_seen[v]:
        # The wall clock was set back since first sight: the time waited so far is unknown, so
        # the back-off restarts now (one delay at most) instead of waiting out the step.
        cursor.first_seen[v] = now
    if v in cursor.resubmit_requested:
        return _after_resubmit(observed, cursor, policy, d)
    if observed.attempt >= policy.max_attempts or not observed.can_resubmit:
        why = (
            f"{job}: PARTIAL after {observed.attempt}/{policy.max_attempts} attempts, "
            f"{observed.outstanding} items outstanding"
            if observed.can_resubmit
            else f"{job}: PARTIAL with {observed.outstanding} items outstanding, and nothing "
            f"can resubmit them: {observed.client} defines no resubmit"
        )
        if not policy.train_on_partial:
            d.reasons.append(f"{why}; not training on incomplete data (train_on_partial is off)")
        elif v in cursor.chain_requested:
            d.reasons.append(f"{why}; training on the accepted parts already requested")
        else:
            cursor.chain_requested.append(v)
            d.actions.append(Action("chain", job, v, observed.attempt, allow_partial=True))
        return d
    wait = cursor.first_seen[v] + policy.delay_before(observed.attempt) - now
    if wait > 0:
        d.reasons.append(
            f"{job}: PARTIAL ({observed.outstanding} outstanding); resubmitting in {wait:.0f}s "
            f"(attempt {observed.attempt + 1}/{policy.max_attempts})"
        )
        return d
    cursor.resubmit_requested[v] = now
    d.actions.append(Action("resubmit", job, v, observed.attempt))
    return d


def _after_resubmit(observed: Observed, cursor: JobCursor, policy: Policy, d: Decision) -> Decision:
    """The version was resubmitted: wait for the newer manifest, or retry a failed resubmission.

    A failed resubmission run (Compute down longer than the op's own retries) would otherwise
    leave the job PARTIAL forever, its run key spent. A retry gets a run key of its own and
    reuses the version's idempotency key, so Compute still runs the outstanding items only once.
    """
    job, v = observed.job_id, observed.latest_version_id
    assert v is not None
    retries = cursor.resubmit_retries.get(v, 0)
    requested = 1 + retries
    if observed.resubmit_active or observed.resubmit_failures < requested:
        d.reasons.append(f"{job}: resubmitted {v}; waiting for the newer manifest")
        return d
    if retries >= policy.max_resubmit_retries:
        d.reasons.append(
            f"{job}: the resubmission of {v} failed {observed.resubmit_failures} time(s); not "
            "retrying past max_resubmit_retries — re-execute the failed run from the UI"
        )
        return d
    cursor.resubmit_retries[v] = retries + 1
    d.actions.append(Action("resubmit", job, v, observed.attempt, retry=retries + 1))
    return d
