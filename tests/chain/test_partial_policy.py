"""The pure PARTIAL policy: every branch of ``decide`` with explicit clocks, no Dagster instance."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from pipeline.defs.partial_policy import Action, Cursor, JobCursor, Observed, decide
from resources.settings import Policy

JOB = "wine-t"
V1, V2, V3 = "wine-t-a001-aaaa", "wine-t-a002-bbbb", "wine-t-a003-cccc"
POLICY = Policy(max_attempts=3, base_delay_seconds=10.0, backoff=2.0)


def partial(version: str = V1, attempt: int = 1, outstanding: int = 54) -> Observed:
    return Observed(JOB, "PARTIAL", attempt, version, outstanding=outstanding)


def succeeded(version: str = V2, attempt: int = 2) -> Observed:
    return Observed(JOB, "SUCCEEDED", attempt, version)


# -- the pieces ------------------------------------------------------------------------------


def test_delay_grows_geometrically_with_the_attempt():
    assert [POLICY.delay_before(a) for a in (1, 2, 3, 4)] == [10.0, 20.0, 40.0, 80.0]
    assert Policy(base_delay_seconds=3, backoff=1).delay_before(5) == 3  # backoff 1: constant


@pytest.mark.parametrize("bad", [{"max_attempts": 0}, {"base_delay_seconds": -1}, {"backoff": 0.5}])
def test_policy_rejects_settings_that_would_storm_or_never_act(bad):
    with pytest.raises(ValidationError):
        Policy(**bad)


def test_run_keys_name_kind_job_version_and_partial_training():
    keys = {
        Action("chain", JOB, V1, 1).run_key,
        Action("chain", JOB, V2, 2).run_key,
        Action("resubmit", JOB, V1, 1).run_key,
        Action("chain", JOB, V1, 1, allow_partial=True).run_key,
        Action("chain", "other-job", V1, 1).run_key,
    }
    assert len(keys) == 5
    assert Action("chain", JOB, V1, 1).run_key == f"chain:{JOB}:{V1}"
    assert Action("resubmit", JOB, V1, 1).run_key == f"resubmit:{JOB}:{V1}"
    assert Action("chain", JOB, V1, 3, allow_partial=True).run_key == f"chain:{JOB}:{V1}:partial"


def test_cursor_round_trips_through_json_and_missing_is_empty():
    c = Cursor(
        jobs={
            JOB: JobCursor(chain_requested=[V2], resubmit_requested={V1: 5.0}, first_seen={V1: 1})
        }
    )
    assert Cursor.from_json(c.to_json()) == c
    assert Cursor.from_json(None) == Cursor() == Cursor.from_json("")


# -- each branch of decide -------------------------------------------------------------------


@pytest.mark.parametrize("state", ["QUEUED", "RUNNING"])
def test_a_running_attempt_is_left_alone(state):
    cursor = JobCursor()
    d = decide(Observed(JOB, state, 2, V1, outstanding=54), cursor, POLICY, now=1e6)
    assert d.actions == []
    assert d.reasons == [f"{JOB}: attempt 2 is {state.lower()}"]
    assert cursor == JobCursor()  # not even first_seen: the back-off clock has not started


def test_failed_job_requests_nothing_and_says_failed():
    cursor = JobCursor()
    d = decide(Observed(JOB, "FAILED", 1, None, message="injected failure"), cursor, POLICY, 0)
    assert d.actions == []
    assert len(d.reasons) == 1 and "FAILED" in d.reasons[0] and "injected failure" in d.reasons[0]
    assert "nothing to train on" in d.reasons[0]
    assert cursor == JobCursor()


def test_failed_resubmission_of_a_partial_version_trains_nothing():
    # The latest version is still the PARTIAL one, but the job is FAILED: no chain, no resubmit.
    d = decide(Observed(JOB, "FAILED", 2, V1, outstanding=54), JobCursor(), POLICY, 0)
    assert d.actions == [] and "FAILED" in d.reasons[0]


def test_a_client_that_cannot_resubmit_is_never_asked_and_the_reason_names_it():
    follower = Observed(
        JOB, "PARTIAL", 1, V1, outstanding=54, can_resubmit=False, client="Compute client m:C"
    )
    cursor = JobCursor()
    d = decide(follower, cursor, POLICY, now=1e6)  # long past any delay
    assert d.actions == [] and cursor.resubmit_requested == {}
    assert d.reasons == [
        f"{JOB}: PARTIAL with 54 items outstanding, and nothing can resubmit them: Compute client "
        "m:C defines no resubmit; not training on incomplete data (train_on_partial is off)"
    ]
    allowed = Policy(train_on_partial=True)
    d = decide(follower, cursor, allowed, now=1e6)
    assert d.actions == [Action("chain", JOB, V1, 1, allow_partial=True)]


def test_succeeded_version_is_requested_once():
    cursor = JobCursor()
    d = decide(succeeded(V2, 2), cursor, POLICY, now=0)
    assert d.actions == [Action("chain", JOB, V2, 2)] and d.reasons == []
    assert cursor.chain_requested == [V2]
    for now in (0, 1, 1e9):
        again = decide(succeeded(V2, 2), cursor, POLICY, now=now)
        assert again.actions == []
        assert again.reasons == [f"{JOB}: version {V2} is complete and already requested"]
    assert cursor.chain_requested == [V2]


@pytest.mark.parametrize(
    ("runs", "said"),
    [
        ({"chain_succeeded": True}, "; its chain run succeeded"),
        ({"chain_active": True, "chain_failures": 1}, "; its chain run is queued or running"),
        ({"chain_failures": 3}, "; its chain FAILED (3 run(s), retries included)"),
    ],
    ids=["succeeded", "retrying", "failed"],
)
def test_a_requested_version_says_what_became_of_its_chain(runs, said):
    """After its build failed for good, a version is not "complete and already requested" and
    nothing more: the reason says it failed, and that the sensor will not request it again."""
    cursor = JobCursor(chain_requested=[V2])
    seen = Observed(JOB, "SUCCEEDED", 2, V2, **runs)
    (reason,) = decide(seen, cursor, POLICY, now=0).reasons
    assert reason.startswith(f"{JOB}: version {V2} is complete and already requested{said}")
    if "FAILED" in said:
        assert "re-execute the failed run" in reason


def test_a_newer_succeeded_version_is_requested_too():
    cursor = JobCursor(chain_requested=[V1])
    d = decide(succeeded(V2, 2), cursor, POLICY, now=0)
    assert [a.run_key for a in d.actions] == [f"chain:{JOB}:{V2}"]
    assert cursor.chain_requested == [V1, V2]


def test_partial_waits_out_the_delay_from_first_sight_then_resubmits_once():
    cursor = JobCursor()
    t0 = 1000.0
    d = decide(partial(), cursor, POLICY, now=t0)
    assert d.actions == []
    assert d.reasons == [f"{JOB}: PARTIAL (54 outstanding); resubmitting in 10s (attempt 2/3)"]
    assert cursor.first_seen == {V1: t0} and cursor.resubmit_requested == {}

    # Later ticks do not restart the clock.
    assert decide(partial(), cursor, POLICY, now=t0 + 9.5).actions == []
    assert cursor.first_seen == {V1: t0}

    d = decide(partial(), cursor, POLICY, now=t0 + 10)
    assert d.actions == [Action("resubmit", JOB, V1, 1)]
    assert cursor.resubmit_requested == {V1: t0 + 10}

    for now in (t0 + 10, t0 + 11, t0 + 1e6):
        again = decide(partial(), cursor, POLICY, now=now)
        assert again.actions == []
        assert again.reasons == [f"{JOB}: resubmitted {V1}; waiting for the newer manifest"]


def test_a_wall_clock_stepped_back_delays_a_resubmission_by_one_delay_at_most():
    """The cursor holds wall-clock times; a clock stepped back an hour must not read as an hour
    still to wait (it did: "resubmitting in 3599s")."""
    cursor = JobCursor()
    t0 = 10_000.0
    decide(partial(), cursor, POLICY, now=t0)
    stepped = t0 + 2 - 3600  # two seconds later, the clock set back an hour
    d = decide(partial(), cursor, POLICY, now=stepped)
    assert d.actions == []
    assert d.reasons == [f"{JOB}: PARTIAL (54 outstanding); resubmitting in 10s (attempt 2/3)"]
    assert decide(partial(), cursor, POLICY, now=stepped + 10).actions == [
        Action("resubmit", JOB, V1, 1)
    ]


def test_each_newer_partial_version_waits_longer():
    cursor = JobCursor()
    waits = []
    for attempt, version in ((1, V1), (2, V2)):
        t0 = attempt * 10_000.0
        ticks = range(0, 100)  # one tick a second from first sight
        first = next(
            t for t in ticks if decide(partial(version, attempt), cursor, POLICY, t0 + t).actions
        )
        waits.append(first)
    assert waits == [10, 20]
    assert set(cursor.resubmit_requested) == {V1, V2}


def test_zero_delay_resubmits_on_first_sight():
    d = decide(partial(), JobCursor(), Policy(base_delay_seconds=0), now=5)
    assert [a.kind for a in d.actions] == ["resubmit"]


def test_attempts_exhausted_trains_nothing_by_default():
    cursor = JobCursor()
    for now in (0, 100, 1e9):
        d = decide(partial(V3, 3, outstanding=7), cursor, POLICY, now=now)
        assert d.actions == []
        assert d.reasons == [
            f"{JOB}: PARTIAL after 3/3 attempts, 7 items outstanding; "
            "not training on incomplete data (train_on_partial is off)"
        ]
    assert cursor.resubmit_requested == {} and cursor.chain_requested == []


def test_attempts_exhausted_with_train_on_partial_requests_one_partial_chain():
    policy = POLICY.model_copy(update={"train_on_partial": True})
    cursor = JobCursor()
    d = decide(partial(V3, 3, outstanding=7), cursor, policy, now=0)
    assert d.actions == [Action("chain", JOB, V3, 3, allow_partial=True)]
    assert d.actions[0].run_key == f"chain:{JOB}:{V3}:partial"
    again = decide(partial(V3, 3, outstanding=7), cursor, policy, now=1)
    assert again.actions == [] and "already requested" in again.reasons[0]


def test_below_max_attempts_train_on_partial_still_resubmits_first():
    policy = Policy(max_attempts=3, base_delay_seconds=0, train_on_partial=True)
    d = decide(partial(V2, 2), JobCursor(), policy, now=0)
    assert [a.kind for a in d.actions] == ["resubmit"]


def test_a_lost_cursor_decides_the_same_run_keys():
    # What makes a lost cursor harmless: the same state yields the same keys, which Dagster
    # deduplicates for the sensor forever. A lost cursor only restarts the back-off clock.
    policy = POLICY.model_copy(update={"train_on_partial": True})
    for obs in (succeeded(), partial(), partial(V3, 3)):
        keys = []
        for _ in range(2):
            cursor = JobCursor()  # the cursor is lost between the two rounds
            actions = decide(obs, cursor, policy, now=500).actions
            actions += decide(obs, cursor, policy, now=500 + policy.delay_before(1)).actions
            keys.append([a.run_key for a in actions])
        assert len(keys[0]) == 1 and keys[0] == keys[1]


@given(
    ticks=st.lists(
        st.tuples(
            st.floats(0, 100, allow_nan=False),
            st.sampled_from(
                [partial(V1, 1), partial(V2, 2), partial(V3, 3), succeeded(V3, 3), succeeded(V2)]
            ),
        ),
        max_size=40,
    ),
    train_on_partial=st.booleans(),
)
def test_any_tick_sequence_requests_each_run_key_at_most_once(ticks, train_on_partial):
    policy = POLICY.model_copy(update={"train_on_partial": train_on_partial})
    cursor = JobCursor()
    now, keys = 0.0, []
    for step, obs in ticks:
        now += step
        d = decide(obs, cursor, policy, now)
        assert len(d.actions) <= 1 and bool(d.actions) != bool(d.reasons)
        keys += [a.run_key for a in d.actions]
        # Round-trip the cursor every tick, as the daemon stores it.
        cursor = Cursor.from_json(Cursor(jobs={JOB: cursor}).to_json()).jobs[JOB]
    assert len(keys) == len(set(keys))
    assert not any(k.startswith(f"resubmit:{JOB}:{V3}") for k in keys)  # 3/3: never resubmitted


# -- a resubmission run that failed ----------------------------------------------------------


def _resubmitted(cursor: JobCursor) -> JobCursor:
    decide(partial(), cursor, Policy(base_delay_seconds=0), now=0.0)
    assert V1 in cursor.resubmit_requested
    return cursor


def test_a_failed_resubmission_run_is_retried_under_a_new_run_key_up_to_the_limit():
    policy = Policy(base_delay_seconds=0, max_resubmit_retries=2)
    cursor = _resubmitted(JobCursor())
    keys = []
    for failures in (1, 1, 2, 2, 3, 3):
        seen = Observed(JOB, "PARTIAL", 1, V1, outstanding=54, resubmit_failures=failures)
        d = decide(seen, cursor, policy, now=1.0)
        keys += [a.run_key for a in d.actions]
    # One retry per failure seen, never one while the last retry has not failed yet.
    assert keys == [f"resubmit:{JOB}:{V1}:retry1", f"resubmit:{JOB}:{V1}:retry2"]
    assert "re-execute the failed run" in d.reasons[0]


def test_no_retry_while_a_resubmission_run_is_still_going():
    cursor = _resubmitted(JobCursor())
    seen = Observed(JOB, "PARTIAL", 1, V1, resubmit_failures=1, resubmit_active=True)
    d = decide(seen, cursor, Policy(base_delay_seconds=0), now=1.0)
    assert d.actions == [] and "waiting for the newer manifest" in d.reasons[0]
