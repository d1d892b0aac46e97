"""Which Compute job the chain follows, and where its settings come from."""

from pipeline.defs.demo import submit_sample_job
from pipeline.defs.sensor import policy_of
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.settings import ChainSettings
from tests.helpers.chain import sample_job


def test_chain_follows_the_most_recently_submitted_job_unless_told(tmp_path):
    compute = LocalCompute(tmp_path / "compute", "inline")
    assert ChainSettings().watched_jobs(compute) == []
    first = sample_job(tmp_path, "wine")
    assert ChainSettings().resolve_job(compute) == first
    second, _ = submit_sample_job("wine", tmp_path, FaultSpec(), job_id="a-later-job",
                                  executor="inline")  # fmt: skip
    # The newest submission wins, not the alphabetically last id.
    assert ChainSettings().resolve_job(compute) == second == "a-later-job"
    assert ChainSettings(job_id=first).watched_jobs(compute) == [first]
    assert ChainSettings(watch_jobs=f"{first}, x").watched_jobs(compute) == [first, "x"]


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("LITHI_JOB_ID", "j-1")
    monkeypatch.setenv("LITHI_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("LITHI_TRAIN_ON_PARTIAL", "true")
    monkeypatch.setenv("LITHI_WORLD_SIZE", "2")
    s = ChainSettings.from_env()
    assert (s.job_id, s.max_attempts, s.train_on_partial, s.world_size) == ("j-1", 5, True, 2)
    assert policy_of(s).max_attempts == 5 and policy_of(s).train_on_partial
