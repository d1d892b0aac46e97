"""Several chains in one code location, declared in a YAML file (``LITHI_CHAINS``).

Each chain has its own keys (``digits/training_run``), group, job, sensor and schedule, its own
source and trainer config; the default chain keeps today's keys. A mistake in the file stops the
load with one line naming the file, the line and the field.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import dagster as dg
import pytest

from assets import CHAIN_ASSETS
from pipeline.defs import latest as latest_cli
from pipeline.defs.chains_file import ChainsFileError, load_chains_file
from pipeline.defs.definitions import build_definitions
from pipeline.defs.demo import write_demo_chains
from pipeline.defs.samples import sample_features
from pipeline.training.record import read_record
from pipeline.training.trainer import REFERENCE_TRAINER
from resources.compute.local import LocalCompute
from resources.settings import LithiEnv, SettingsError
from tests.helpers.chain import observations

ROOT = Path(__file__).resolve().parents[2]


def _readme_chains() -> str:
    """The two-chain file the README shows (its "Several chains" section), job ids as fields."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Several chains") :]
    block = section[section.index("```yaml\n") + len("```yaml\n") :]
    block = block[: block.index("```")]
    return (
        block.replace("{", "{{")
        .replace("}", "}}")
        .replace("job-digits", "{digits}")
        .replace("job-wine", "{wine}")
    )


TWO_CHAINS = _readme_chains()
#: The links a chain run materializes, as the default chain names them (compute_versions is
#: observed, not built)
BUILT = [a.key.to_user_string() for a in CHAIN_ASSETS if not isinstance(a, dg.SourceAsset)]


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "chains.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def _env(tmp_path: Path, chains: Path | None, samples, **kw) -> LithiEnv:
    return LithiEnv(
        home=tmp_path / "home",
        compute_root=samples.compute_root,
        compute_executor="inline",
        num_workers=0,
        torch_threads=1,
        chains=chains,
        **kw,
    )


def _keys(defs: dg.Definitions) -> set[str]:
    graph = defs.get_repository_def().asset_graph
    return {k.to_user_string() for k in graph.get_all_asset_keys()}


def test_each_declared_chain_has_its_own_keys_group_job_sensor_and_schedule(
    tmp_path, labelled_samples
):
    path = _file(tmp_path, TWO_CHAINS.format(**labelled_samples.jobs))
    defs = build_definitions(_env(tmp_path, path, labelled_samples))
    repo = defs.get_repository_def()
    links = ["compute_versions", *BUILT]
    assert _keys(defs) == {f"{c}/{k}" for c in ("digits", "wine") for k in links}
    graph = repo.asset_graph
    for chain in ("digits", "wine"):
        run = graph.get(dg.AssetKey([chain, "training_run"]))
        assert run.group_name == chain
        assert run.parent_keys == {dg.AssetKey([chain, "disjoint_index"])}
        manifest = graph.get(dg.AssetKey([chain, "result_manifest"]))
        assert manifest.parent_keys == {dg.AssetKey([chain, "compute_versions"])}
    checks = {c.to_user_string() for c in graph.asset_check_keys}
    assert "digits/result_manifest:result_manifest_complete" in checks
    assert "wine/training_run:iterated_counts_reconcile" in checks
    assert {j.name for j in repo.get_all_jobs()} >= {
        "digits_chain_job",
        "wine_chain_job",
        "resubmit_outstanding_job",
    }
    assert "compute_chain_job" not in {j.name for j in repo.get_all_jobs()}
    assert {s.name for s in repo.sensor_defs} == {"digits_partial_sensor", "wine_partial_sensor"}
    assert {s.name for s in repo.schedule_defs} == {
        "digits_chain_schedule",
        "wine_chain_schedule",
    }


def test_the_default_chain_keeps_todays_keys_beside_declared_ones(tmp_path, labelled_samples):
    lines = TWO_CHAINS.format(**labelled_samples.jobs).splitlines()
    text = "\n".join(line for line in lines if not line.startswith("default_chain:"))
    defs = build_definitions(_env(tmp_path, _file(tmp_path, text), labelled_samples))
    keys = _keys(defs)
    assert {"training_run", "digits/training_run", "wine/training_run"} <= keys
    assert len(keys) == 21


def test_each_chain_runs_its_own_source_with_its_own_config(tmp_path, labelled_samples, capsys):
    path = _file(tmp_path, TWO_CHAINS.format(**labelled_samples.jobs))
    defs = build_definitions(_env(tmp_path, path, labelled_samples))
    records = {}
    with dg.instance_for_test() as instance:
        for chain in ("digits", "wine"):
            result = defs.resolve_job_def(f"{chain}_chain_job").execute_in_process(
                instance=instance
            )
            assert result.success
            made = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
            assert made == {f"{chain}/{k}" for k in BUILT}
            assert all(c.passed for c in result.get_asset_check_evaluations())
            event = instance.get_latest_materialization_event(dg.AssetKey([chain, "training_run"]))
            assert event is not None and event.asset_materialization is not None
            records[chain] = read_record(event.asset_materialization.metadata["record"].value)
        # each chain's newest model is its own, whichever ran last
        assert instance.get_latest_materialization_event(dg.AssetKey("training_run")) is None
        for chain in ("digits", "wine"):  # and a script reads each chain's own summary
            assert latest_cli.main(["--summary", "--chain", chain]) == 0
            items = records[chain].reconciliation.items_expected
            assert f"reconciled {items}/{items}," in capsys.readouterr().out
        assert records["digits"].reconciliation.items_expected != (
            records["wine"].reconciliation.items_expected
        )
    compute = LocalCompute(labelled_samples.compute_root)
    for chain in ("digits", "wine"):
        latest = compute.status(labelled_samples.jobs[chain]).latest_version_id
        assert records[chain].snapshot.version_id == latest
    assert records["digits"].config["epochs"] == 2
    assert (records["wine"].config["epochs"], records["wine"].config["hidden"]) == (3, 16)
    assert len(records["digits"].loss_curve) == 2 and len(records["wine"].loss_curve) == 3


def test_each_chains_sensor_launches_its_own_job_for_its_own_source(tmp_path, labelled_samples):
    path = _file(tmp_path, TWO_CHAINS.format(**labelled_samples.jobs))
    defs = build_definitions(_env(tmp_path, path, labelled_samples))
    with dg.instance_for_test() as instance:
        for chain, other in (("digits", "wine"), ("wine", "digits")):
            sensor = defs.resolve_sensor_def(f"{chain}_partial_sensor")
            with dg.build_sensor_context(
                instance=instance, definitions=defs, resources=defs.resources
            ) as ctx:
                result = sensor.evaluate_tick(ctx)
            (request,) = result.run_requests
            assert request.job_name == f"{chain}_chain_job"
            assert request.tags["lithi/chain"] == chain
            assert request.tags["lithi/job_id"] == labelled_samples.jobs[chain]
            observed = {e.asset_key.to_user_string() for e in observations(result)}
            assert observed == {f"{chain}/compute_versions"}
            assert labelled_samples.jobs[other] not in str(result.run_requests)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "chains:\n  - name: digits\n    source: {job_id: job-1}\n    epochs: 2\n",
            ":4: chains[0].epochs: unknown field",
        ),
        (
            "default_chain: maybe\nchains:\n  - name: digits\n    source: {job_id: job-1}\n",
            ":1: default_chain: ",
        ),
        (
            "chains:\n  - name: digits\n    source: {job_id: job-1}\n"
            "    trainer: nowhere.at_all:Trainer\n",
            ":4: chains[0].trainer: ",
        ),
        (
            "chains:\n  - name: digits\n    source: {job_id: job-1}\n"
            "  - name: wine\n    source: {job_id: job-2, bundle_url: /x}\n",
            ":5: chains[1].source: ",
        ),
        ("chains:\n  - name: Digits!\n    source: {job_id: job-1}\n", ":2: chains[0].name: "),
        ("chains: [\n", "not YAML"),
        ("default_chain:\n  trainer: nowhere.at_all:T\n", ":2: default_chain.trainer: "),
        ("default_chain:\n  config: {}\n  epochs: 2\n", ":3: default_chain.epochs: unknown field"),
        ("default_chain: false\n", "declares no chain"),
    ],
    ids=[
        "unknown-field",
        "bad-type",
        "unknown-trainer",
        "two-sources",
        "bad-name",
        "not-yaml",
        "default-trainer",
        "default-field",
        "no-chain",
    ],
)
def test_a_mistake_stops_the_load_in_one_line_naming_file_line_and_field(tmp_path, text, said):
    path = _file(tmp_path, text)
    with pytest.raises(ChainsFileError) as caught:
        load_chains_file(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and said in message, message
    assert "\n" not in message


def test_a_config_its_trainer_refuses_stops_the_load_at_the_chains_config(
    tmp_path, labelled_samples
):
    text = "chains:\n  - name: digits\n    source: {job_id: job-1}\n    config: {epochs: 0}\n"
    path = _file(tmp_path, text)
    with pytest.raises(SettingsError) as caught:
        build_definitions(_env(tmp_path, path, labelled_samples))
    message = str(caught.value)
    assert message.startswith(f"{path}:4: chains[0].config: "), message
    assert "epochs" in message and "\n" not in message


def test_the_default_chain_can_be_declared_and_a_plain_materialize_trains_it(
    tmp_path, labelled_samples
):
    """What `make demo` writes and `make ui` reads: the default chain's trainer and config in
    the file, so a Materialize with no run config trains as the demo did."""
    path = write_demo_chains(
        tmp_path, REFERENCE_TRAINER, {"features": sample_features("wine"), "epochs": 2}
    )
    env = _env(tmp_path, path, labelled_samples, job_id=labelled_samples.jobs["wine"])
    defs = build_definitions(env)
    assert {"training_run", "result_manifest"} <= _keys(defs)
    job = defs.resolve_job_def("compute_chain_job")
    config = dg.validate_run_config(job, {})["ops"]["training_run"]["config"]
    assert config["features"] == sample_features("wine") and config["epochs"] == 2
    with dg.instance_for_test() as instance:
        assert job.execute_in_process(instance=instance).success


def test_a_default_chain_config_its_trainer_refuses_stops_the_load(tmp_path, labelled_samples):
    path = _file(tmp_path, "default_chain:\n  config: {epochs: 0}\n")
    with pytest.raises(SettingsError) as caught:
        build_definitions(_env(tmp_path, path, labelled_samples))
    assert str(caught.value).startswith(f"{path}:2: default_chain.config: ")
