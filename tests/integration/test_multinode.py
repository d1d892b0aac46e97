"""Two torchrun "nodes" on this machine train through the chain's own entry point, exactly once.

Each node is its own ``torchrun --nnodes 2 --node-rank K --nproc-per-node 1`` process meeting the
other at a c10d rendezvous on 127.0.0.1, as two machines would; they run
``pipeline.defs.train_launch`` (what the ``training_run`` asset launches) outside Dagster, as a
cluster scheduler would start the nodes other than Dagster's. The bundle, the cache and ``--out``
are one filesystem here; across machines they must be shared storage (README, Beyond one
machine). The outcome rank 0 writes must reconcile: every item of the manifest iterated exactly
once across both nodes' ranks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.defs import samples
from pipeline.readers.index import Index
from pipeline.training.runner import TrainSummary, hash_checkpoint
from pipeline.training.trainer import REFERENCE_TRAINER
from resources.bundle_store import BundleStore
from resources.compute.faults import FaultSpec
from tests.helpers.ports import free_port
from tests.helpers.stacks import DUMP_ON_ABORT, abort_tree
from tests.helpers.timing import limit, wait_until

ROOT = Path(__file__).resolve().parents[2]
ITEMS = 5_000


def node_command(node_rank: int, port: int, launch_args: list[str]) -> list[str]:
    """One node's torchrun command: the README's multi-node recipe, with this machine's python."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "lithi-multinode-test", "--local-addr", "127.0.0.1",
        "-m", "pipeline.defs.train_launch", *launch_args,
    ]  # fmt: skip


@pytest.mark.timeout(600)
def test_two_torchrun_nodes_train_and_reconcile_exactly_once(tmp_path):
    job_id, compute = samples.submit_sample_job(
        samples.SYNTHETIC, tmp_path, FaultSpec(), job_id="multinode", executor="inline", items=ITEMS
    )
    cache = tmp_path / "cache"
    store = BundleStore(cache)
    view = store.fetch(compute.manifest_url(job_id)).path
    index = Index.from_snapshot(store.verify(view))
    out = tmp_path / "run"
    config = {"features": ["embedding"], "epochs": 2, "batch_size": 256}
    launch_args = [
        "--bundle", str(view), "--cache-dir", str(cache), "--index-sha256", index.digest,
        "--trainer", REFERENCE_TRAINER, "--config", json.dumps(config), "--out", str(out),
    ]  # fmt: skip
    # Outside Dagster: no Pipes context in the environment, so no rank opens a Pipes channel.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    port = free_port()
    nodes = [
        subprocess.Popen(
            node_command(k, port, launch_args),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in (0, 1)
    ]
    logs = []
    try:
        for node in nodes:
            stdout, stderr = node.communicate(timeout=limit(480))
            logs.append(stdout + stderr)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    for k, (node, log) in enumerate(zip(nodes, logs, strict=True)):
        assert node.returncode == 0, f"node {k} exited {node.returncode}:\n{log[-4000:]}"

    # Each node ran exactly one of the two ranks (which one is the rendezvous's choice).
    ranks = [set(re.findall(r"\[rank (\d)\] rank \d of 2 on cpu: index", log)) for log in logs]
    assert sorted(r for rs in ranks for r in rs) == ["0", "1"], logs
    assert all(len(rs) == 1 for rs in ranks)

    summary = TrainSummary.model_validate_json((out / "outcome.json").read_text())
    report = summary.reconciliation
    assert summary.world_size == 2
    assert report.ok, report.problems()
    assert report.owners == 2  # both nodes' ranks were gathered
    assert report.items_iterated == report.items_expected == ITEMS
    assert report.duplicates == 0 and report.missing == 0
    assert summary.checkpoint == hash_checkpoint(out / "checkpoint")
    assert summary.metrics["holdout_accuracy"] > 0.9


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def elastic_node_command(port: int, launch_args: list[str]) -> list[str]:
    """One node of an elastic run: one or two nodes (``--nnodes 1:2``), restarts allowed, a short
    last call so the survivors of a lost node go on without waiting for a replacement."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "lithi-elastic-test", "--rdzv-conf", "last_call_timeout=3",
        "--local-addr", "127.0.0.1",
        "-m", "pipeline.defs.train_launch", *launch_args,
    ]  # fmt: skip


@pytest.mark.timeout(600)
def test_a_node_lost_mid_epoch_resumes_on_the_node_left_with_nnodes_min_max(tmp_path):
    """Two elastic torchrun nodes (``--nnodes 1:2``); once a cut is committed the second node's
    whole process group is SIGKILLed. The first node's torchrun restarts its rank in a world of
    one, which resumes the cut the two ranks took; the interrupted epoch reconciles as one."""
    job_id, compute = samples.submit_sample_job(
        samples.SYNTHETIC, tmp_path, FaultSpec(), job_id="elastic", executor="inline", items=ITEMS
    )
    cache = tmp_path / "cache"
    store = BundleStore(cache)
    view = store.fetch(compute.manifest_url(job_id)).path
    index = Index.from_snapshot(store.verify(view))
    out, progress = tmp_path / "run", tmp_path / "progress"
    config = {"features": ["embedding"], "epochs": 12, "batch_size": 64}
    launch_args = [
        "--bundle", str(view), "--cache-dir", str(cache), "--index-sha256", index.digest,
        "--trainer", REFERENCE_TRAINER, "--config", json.dumps(config), "--out", str(out),
        "--progress-dir", str(progress), "--checkpoint-every", "5",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    # torchrun's agent logs its rendezvous rounds (LOGLEVEL), and a hung process its stacks
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), LOGLEVEL="INFO", **DUMP_ON_ABORT)
    port = free_port()

    def start(name: str) -> subprocess.Popen:
        log = (tmp_path / f"{name}.log").open("w")
        return subprocess.Popen(
            elastic_node_command(port, launch_args),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the whole node can be killed
        )

    # The first node hosts the rendezvous store; the second joins it.
    first = start("node-0")
    wait_until(
        lambda: _listening(port) or first.poll() is not None,
        timeout=limit(120),
        what="the first node to host the rendezvous store",
    )
    second = start("node-1")
    try:
        wait_until(
            lambda: (progress / "committed.json").exists(),
            timeout=limit(300),
            what="a cut committed by both ranks",
        )
        assert json.loads((progress / "committed.json").read_text())["world_size"] == 2
        os.killpg(second.pid, signal.SIGKILL)
        second.wait()
        try:
            first.wait(timeout=limit(420))
        except subprocess.TimeoutExpired:
            aborted = abort_tree(first.pid)  # each process prints where it is stuck
            log = (tmp_path / "node-0.log").read_text()
            pytest.fail(
                "the first node did not finish; aborted:\n  " + "\n  ".join(aborted)
                + "\nits log:\n" + log[-20000:]
            )  # fmt: skip
    finally:
        for node in (first, second):
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    log = (tmp_path / "node-0.log").read_text()
    assert first.returncode == 0, log[-4000:]
    summary = TrainSummary.model_validate_json((out / "outcome.json").read_text())
    assert summary.world_size == 1
    assert summary.resumed is not None and summary.resumed.world_size == 2, log[-4000:]
    assert f"resumed after step {summary.resumed.step} (cut on 2 rank(s), resumed on 1)" in log
    interrupted = summary.resumed.reconciliation
    assert interrupted.ok, interrupted.problems()
    assert interrupted.duplicates == 0 and interrupted.missing == 0
    assert interrupted.items_iterated == ITEMS
    assert summary.reconciliation.ok and summary.reconciliation.items_iterated == ITEMS
    assert summary.checkpoint == hash_checkpoint(out / "checkpoint")
