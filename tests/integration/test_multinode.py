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
from tests.helpers.timing import limit

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
