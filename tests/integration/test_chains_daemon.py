"""Two chains in one code location, through the real daemon.

The code location declares two chains (``LITHI_CHAINS``) over two Compute jobs, with two trainer
configs. Each new complete version of a chain's source gives exactly one run of that chain's own
job; the other chain is untouched; each chain's ``compute_versions`` records only its own job's
versions; and over several sensor ticks with no new version, nothing is launched.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from pipeline.defs.daemon import start_daemon, stop_daemon
from pipeline.defs.instance import PROJECT_YAML, prepare_instance
from pipeline.defs.samples import submit_sample_job
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from tests.helpers.dagster_internals import InstigatorType
from tests.helpers.timing import limit, wait_until

CHAINS = """\
default_chain: false
chains:
  - name: digits
    source: {{job_id: {digits}}}
    config: {{auto_features: true, epochs: 1}}
  - name: wine
    source: {{job_id: {wine}}}
    config: {{auto_features: true, epochs: 2, hidden: 16}}
"""

#: Sensor ticks, per chain, watched with no new version before counting the runs again.
QUIET_TICKS = 3


def _runs(instance: dg.DagsterInstance, job_name: str) -> list[dg.DagsterRun]:
    return list(reversed(instance.get_runs(filters=dg.RunsFilter(job_name=job_name))))


def _ticks(instance: dg.DagsterInstance, sensor: str) -> int:
    """How many ticks the daemon has recorded for ``sensor``."""
    states = [
        s
        for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
        if s.name == sensor
    ]
    return sum(len(instance.get_ticks(s.instigator_origin_id, s.selector_id)) for s in states)


def _versions_observed(instance: dg.DagsterInstance, chain: str) -> set[tuple[str, str]]:
    """(job, version) of every observation of ``chain``'s ``compute_versions``."""
    records = instance.fetch_observations(dg.AssetKey([chain, "compute_versions"]), limit=100)
    out = set()
    for r in records.records:
        meta = r.asset_observation.metadata if r.asset_observation else {}
        out.add((meta["job_id"].value, meta["version_id"].value))
    return out


def test_each_new_version_runs_its_own_chain_once_and_quiet_ticks_launch_nothing(tmp_path):
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(PROJECT_YAML.read_text())
    prepare_instance(dagster_home)
    home = tmp_path / "lithi"
    # digits starts PARTIAL: its sensor resubmits, and the complete version that lands is its
    # second; wine is complete from the start
    digits, compute = submit_sample_job("digits", home, FaultSpec(lose_fraction=0.2))
    wine, _ = submit_sample_job("wine", home, FaultSpec())
    compute.wait(digits, timeout=limit(120))
    compute.wait(wine, timeout=limit(120))
    assert compute.status(digits).state == "PARTIAL"
    chains = tmp_path / "chains.yaml"
    chains.write_text(CHAINS.format(digits=digits, wine=wine))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITHI_")} | {
        "DAGSTER_HOME": str(dagster_home),
        "LITHI_HOME": str(home),
        "LITHI_CHAINS": str(chains),
        "LITHI_RESUBMIT_DELAY_SECONDS": "0",
        "LITHI_NUM_WORKERS": "0",
    }
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        daemon = start_daemon(env, home / "daemon.log")
        try:
            for chain in ("digits", "wine"):
                wait_until(
                    lambda c=chain: any(
                        r.status == dg.DagsterRunStatus.SUCCESS
                        for r in _runs(instance, f"{c}_chain_job")
                    ),
                    timeout=limit(480),
                    what=f"a successful {chain} chain run (see {home / 'daemon.log'})",
                    every=1.0,
                )
            launched = len(instance.get_runs())
            ticks = {c: _ticks(instance, f"{c}_partial_sensor") for c in ("digits", "wine")}
            for chain in ("digits", "wine"):
                wait_until(
                    lambda c=chain: (
                        _ticks(instance, f"{c}_partial_sensor") >= ticks[c] + QUIET_TICKS
                    ),
                    timeout=limit(180),
                    what=f"{QUIET_TICKS} more ticks of {chain}'s sensor",
                    every=1.0,
                )
            quiet = len(instance.get_runs()) - launched
        finally:
            stop_daemon(daemon)
        assert quiet == 0, f"{quiet} run(s) launched over {QUIET_TICKS} ticks with no new version"
        local = LocalCompute(home / "compute")
        for chain, job in (("digits", digits), ("wine", wine)):
            runs = _runs(instance, f"{chain}_chain_job")
            latest = local.status(job).latest_version_id
            # exactly one run, of the chain's own job, for its source's one complete version
            assert [
                (r.status, r.tags["lithi/job_id"], r.tags["lithi/version_id"]) for r in runs
            ] == [(dg.DagsterRunStatus.SUCCESS, job, latest)]
            assert runs[0].tags["lithi/chain"] == chain
            observed = _versions_observed(instance, chain)
            assert {j for j, _ in observed} == {job}  # its own job's versions, and only those
            assert (job, latest) in observed
            event = instance.get_latest_materialization_event(dg.AssetKey([chain, "training_run"]))
            assert event is not None and event.run_id == runs[0].run_id
        # digits' PARTIAL first version and its complete second were both observed
        assert len(_versions_observed(instance, "digits")) == 2
        assert not _runs(instance, "compute_chain_job")  # no default chain was declared
    assert Path(home / "daemon.log").exists()
