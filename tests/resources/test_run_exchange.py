"""The exchange between the Dagster step and ranks on other machines (``resources.run_exchange``):
what the ranks need is published once, and what comes back is trusted only by its digests.

The whole exchange over an S3 API, across Ray nodes, is tests/integration/test_ray_cluster.py.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from pipeline.bundle.errors import DigestMismatch
from pipeline.readers.index import Index
from pipeline.training import REFERENCE_TRAINER
from pipeline.training.runner import CHECKPOINT_DIR, OUTCOME, train_once
from pipeline.training.trainer import load_trainer
from resources.bundle_store import BundleStore
from resources.run_exchange import (
    RunExchange,
    Tether,
    Untethered,
    collect_outcome,
    heartbeat,
    load_index,
    publish_inputs,
    publish_outcome,
)
from tests.helpers.timing import limit, wait_until
from tests.helpers.training import classes_index, fit_config


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Index:
    return classes_index(tmp_path_factory.mktemp("exchange"))


@pytest.fixture(scope="module")
def trained(index, tmp_path_factory):
    """A run folder as a rank leaves it (checkpoint/ and outcome.json) and its summary."""
    out = tmp_path_factory.mktemp("rank-0")
    config = {**fit_config("map"), "epochs": 1}
    summary = train_once(load_trainer(REFERENCE_TRAINER), index, config, out, log=lambda _: None)
    assert summary is not None
    return out, summary


def _exchange(tmp_path, index) -> RunExchange:
    return RunExchange(str(tmp_path / "url"), "run-1", index.snapshot.identity.version_id, "k")


def test_a_rank_with_a_cache_of_its_own_gets_the_bundle_and_the_saved_index(tmp_path, index):
    exchange = _exchange(tmp_path, index)
    publish_inputs(BundleStore(tmp_path / "step-cache"), exchange, index.snapshot, index)
    node = BundleStore(tmp_path / "node-cache")
    fetched = node.fetch(exchange.bundle_url)
    assert fetched.files_downloaded == len(index.snapshot.manifest.bound_files)
    snapshot = node.verify(fetched.path)
    (tmp_path / "scratch").mkdir()
    loaded = load_index(node, exchange, snapshot, tmp_path / "scratch")
    assert loaded.digest == index.digest and loaded.ids == index.ids
    # publishing the same version again writes nothing over what is there
    publish_inputs(BundleStore(tmp_path / "step-cache"), exchange, index.snapshot, index)


def test_the_outcome_comes_back_whole_and_read_only(tmp_path, index, trained):
    out, summary = trained
    url = _exchange(tmp_path, index).attempt_url(0)
    store = BundleStore(tmp_path / "cache")
    publish_outcome(store, url, out, summary)
    got = collect_outcome(store, url, tmp_path / "step")
    assert got == summary
    for rel in summary.checkpoint.files:
        mode = os.stat(tmp_path / "step" / CHECKPOINT_DIR / rel).st_mode
        assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert json.loads((tmp_path / "step" / OUTCOME).read_text())["checkpoint"]["sha256"] == (
        summary.checkpoint.sha256
    )


def test_a_checkpoint_file_changed_at_the_url_is_refused_by_name(tmp_path, index, trained):
    out, summary = trained
    url = _exchange(tmp_path, index).attempt_url(0)
    store = BundleStore(tmp_path / "cache")
    publish_outcome(store, url, out, summary)
    rel = sorted(summary.checkpoint.files)[0]
    remote = tmp_path / "url" / "runs" / "run-1" / "attempt-0" / CHECKPOINT_DIR / rel
    os.chmod(remote, 0o644)
    remote.write_bytes(remote.read_bytes() + b"\0")
    with pytest.raises(DigestMismatch, match=rel):
        collect_outcome(store, url, tmp_path / "step")
    assert not (tmp_path / "step" / OUTCOME).exists()  # nothing vouches for a half-checked run


def _beats(url: str) -> int:
    """The counter at a local ``url``; 0 while a beat is being written (a local file is
    rewritten in place, so a read can fall between its truncation and its new digits)."""
    text = Path(url).read_text()
    return int(text) if text else 0


def test_the_heartbeat_rises_while_the_step_waits_and_its_silence_stops_the_job(tmp_path):
    store = BundleStore(tmp_path / "cache")
    url = str(tmp_path / "url" / "heartbeat")
    (tmp_path / "url").mkdir()
    with heartbeat(store, url, every=0.01):
        wait_until(lambda: _beats(url) >= 3, timeout=limit(30), what="three beats")
    last = Path(url).read_text()
    tether = Tether(store, url, timeout=0.1)  # the step is gone: the counter stays put

    def untethered() -> bool:
        try:
            tether.check()
        except Untethered as e:
            assert url in str(e)
            return True
        return False

    wait_until(untethered, timeout=limit(30), what="the tether to notice the silence")
    assert Path(url).read_text() == last
