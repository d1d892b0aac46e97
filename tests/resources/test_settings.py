"""Settings: every LITHI_* variable parsed in one place, a bad one refused in one named line."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pipeline.defs.definitions import build_definitions, resources_from
from pipeline.defs.samples import submit_sample_job
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.dagster.chain_settings import ChainSettings
from resources.settings import REPO_ROOT, LithiEnv, SettingsError
from tests.helpers.chain import sample_job
from tests.helpers.refusals import one_line_refusal


def _settings(**kw) -> ChainSettings:
    return ChainSettings(**kw)


def test_chain_follows_the_most_recently_submitted_job_unless_told(tmp_path):
    compute = LocalCompute(tmp_path / "compute", "inline")
    assert _settings().watched_jobs(compute) == []
    first = sample_job(tmp_path, "wine")
    assert _settings().resolve_job(compute) == first
    second, _ = submit_sample_job("wine", tmp_path, FaultSpec(), job_id="a-later-job",
                                  executor="inline")  # fmt: skip
    # The newest submission wins, not the alphabetically last id.
    assert _settings().resolve_job(compute) == second == "a-later-job"
    assert _settings(job_id=first).watched_jobs(compute) == [first]
    assert _settings(watch_jobs=f"{first}, x").watched_jobs(compute) == [first, "x"]


@pytest.fixture
def clean_env(monkeypatch):
    """No LITHI_* variable from the caller's environment leaks into a test."""
    for name in [n for n in os.environ if n.startswith("LITHI_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_every_setting_comes_from_its_variable(clean_env, tmp_path):
    env = {
        "LITHI_HOME": str(tmp_path / "home"),
        "LITHI_JOB_ID": "j-1",
        "LITHI_MAX_ATTEMPTS": "5",
        "LITHI_RESUBMIT_DELAY_SECONDS": "0.5",
        "LITHI_TRAIN_ON_PARTIAL": "true",
        "LITHI_WORLD_SIZE": "2",
        "LITHI_NUM_WORKERS": "0",
        "LITHI_CACHE_DIR": str(tmp_path / "elsewhere"),
        "LITHI_CREDENTIAL_REFS": "lab=LAB_TOKEN, other=OTHER_TOKEN",
        "LITHI_COMPUTE_EXECUTOR": "inline",
        "LITHI_LINK_LOCAL": "false",
        "LITHI_REHASH": "true",
    }
    for k, v in env.items():
        clean_env.setenv(k, v)
    res = resources_from(LithiEnv.load())
    s: ChainSettings = res["chain_settings"]
    assert (s.job_id, s.world_size, s.num_workers) == ("j-1", 2, 0)
    assert (s.policy.max_attempts, s.policy.base_delay_seconds) == (5, 0.5)
    assert s.policy.train_on_partial is True
    assert res["artifacts"].root == str(tmp_path / "home" / "artifacts")  # under LITHI_HOME
    assert res["compute"].root == str(tmp_path / "home" / "compute")
    assert res["compute"].executor == "inline"
    assert res["bundle_store"].store().cache_dir == tmp_path / "elsewhere"
    assert res["bundle_store"].credential_refs == {"lab": "LAB_TOKEN", "other": "OTHER_TOKEN"}
    store = res["bundle_store"].store()
    assert (store.link, store.rehash) == (False, True)


def test_empty_means_unset(clean_env):
    clean_env.setenv("LITHI_MAX_ATTEMPTS", "")
    assert LithiEnv.load().max_attempts == 3


#: Where a bad value is refused: when the settings are read (and so again when the code location
#: loads), or only when the code location loads (the trainer is imported, its config checked).
READ = [LithiEnv.load, build_definitions]
LOADED = [build_definitions]


@pytest.mark.parametrize(
    ("name", "value", "expected", "loads"),
    [
        ("LITHI_MAX_ATTEMPTS", "abc", "expected a whole number", READ),
        ("LITHI_MAX_ATTEMPTS", "0", "greater than or equal to 1", READ),
        ("LITHI_MAX_ATTEMPTS", "-2", "greater than or equal to 1", READ),
        ("LITHI_RESUBMIT_DELAY_SECONDS", "nan", "expected a finite number", READ),
        ("LITHI_RESUBMIT_DELAY_SECONDS", "inf", "expected a finite number", READ),
        ("LITHI_RESUBMIT_DELAY_SECONDS", "-1", "greater than or equal to 0", READ),
        ("LITHI_MAX_RESUBMIT_RETRIES", "1.5", "expected a whole number", READ),
        ("LITHI_TRAIN_ON_PARTIAL", "maybe", "expected true or false", READ),
        ("LITHI_WORLD_SIZE", "0", "greater than or equal to 1", READ),
        ("LITHI_NUM_WORKERS", "two", "expected a whole number", READ),
        ("LITHI_COMPUTE_EXECUTOR", "threads", "'subprocess' or 'inline'", READ),
        ("LITHI_CREDENTIAL_REFS", "lab", "expected 'ref=ENV_VAR,...'", READ),
        ("LITHI_CREDENTIAL_REFS", "lab=not a name", "environment variable name", READ),
        ("LITHI_TRAINER_CONFIG", "[1]", "expected a JSON object, found list", READ),
        ("LITHI_TRAINER", "not a path", "expected an import path", READ),
        (
            "LITHI_TRAINER_CONFIG",
            '{"epochs": "many"}',
            "ReferenceTrainer config: epochs: Input",
            LOADED,
        ),
        ("LITHI_TRAINER", "my_pkg.nowhere:T", "cannot import 'my_pkg.nowhere'", LOADED),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(clean_env, name, value, expected, loads):
    clean_env.setenv(name, value)
    for load in loads:
        message = one_line_refusal(SettingsError, load)
        assert message.startswith(f"{name}={value!r}: ") and expected in message


def test_a_bad_cron_is_refused_naming_the_variable(clean_env):
    clean_env.setenv("LITHI_CHAIN_CRON", "every night")
    with pytest.raises(SettingsError, match=r"^LITHI_CHAIN_CRON='every night': not a cron"):
        build_definitions()


SOURCES = [p for d in ("pipeline", "assets", "resources") for p in (REPO_ROOT / d).rglob("*.py")]


def test_no_lithi_variable_is_read_anywhere_else():
    reads = re.compile(r"""(environ\.get|getenv|environ\[)\(?\s*["']LITHI_""")
    offenders = [
        str(p.relative_to(REPO_ROOT))
        for p in SOURCES
        if p != REPO_ROOT / "resources" / "settings.py" and reads.search(p.read_text())
    ]
    assert offenders == []


def test_the_readme_table_lists_every_variable():
    readme = Path(REPO_ROOT / "README.md").read_text()
    table = readme[readme.index("## Configuration") :]
    table = table[: table.index("\n## ", 1)]
    missing = [
        f"LITHI_{name.upper()}"
        for name in LithiEnv.model_fields
        if f"| `LITHI_{name.upper()}` |" not in table
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("name", "value"), [("LITHI_JOB_ID", "../../outside/evil"), ("LITHI_WATCH_JOBS", "ok,a/b")]
)
def test_a_job_id_outside_the_rule_is_refused_at_load(clean_env, name, value):
    clean_env.setenv(name, value)
    with pytest.raises(SettingsError, match=f"{name}: job id .* is not valid") as e:
        LithiEnv.load()
    assert "\n" not in str(e.value)
