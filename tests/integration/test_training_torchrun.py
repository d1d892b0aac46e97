"""world_size 2: training runs as real torchrun processes launched through Dagster Pipes, and a
rank SIGKILLed mid-epoch is restarted by torchrun and resumes from its last cut.

A plain world-size-2 chain through Pipes is also what the demo runs (tests/integration/
test_demo.py); this test checks what the demo cannot see: what came back through the Pipes
channel, the record, and the restart.
"""

import json

import dagster as dg

from assets import CHAIN_ASSETS
from assets._metadata import plain
from assets.training_run import TrainingConfig
from pipeline.training.record import read_record


def _materialize(resources: dict, config: TrainingConfig, selection: list) -> tuple:
    """Materialize ``selection`` of the chain on a test instance; the result and its log lines."""
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            CHAIN_ASSETS,
            resources=resources,
            run_config=dg.RunConfig(ops={"training_run": config}),
            instance=instance,
            selection=selection,
        )
        assert result.success
        logs = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
        tags = instance.get_run_by_id(result.run_id).tags
    # the run names its trainer and the config it trained with, whoever launched it
    assert tags["lithi/trainer"] == config.trainer
    trained_with = json.loads(tags["lithi/trainer_config"])
    assert trained_with["epochs"] == config.epochs and trained_with["auto_features"] is True
    return result, logs


def test_a_rank_killed_mid_epoch_is_restarted_by_torchrun_and_resumes(
    tmp_path, labelled_samples, monkeypatch
):
    """SIGKILL of rank 1 mid-epoch: torchrun restarts both ranks, they resume from the last cut,
    and the record names its step; the interrupted epoch reconciles across both ranks."""
    marker = tmp_path / "killed"
    monkeypatch.setenv("KILL_MARKER", str(marker))
    monkeypatch.setenv("KILL_RANK", "1")
    # wine: 178 items, 89 a rank, 12 batches of 8 an epoch: killed at step 8 of epoch 1.
    monkeypatch.setenv("KILL_AFTER", "8")
    resources = labelled_samples.resources(
        tmp_path, "wine", world_size=2, num_workers=1, checkpoint_every=5
    )
    config = TrainingConfig(
        trainer="tests.helpers.killed_trainer:KilledOnce",
        epochs=2,
        batch_size=8,
        auto_features=True,
    )
    result, logs = _materialize(resources, config, CHAIN_ASSETS)
    assert marker.exists(), "rank 1 was meant to be killed once"
    meta = result.asset_materializations_for_node("training_run")[0].metadata
    # Metadata reported from inside the torchrun process came back through the Pipes channel
    # (only what the step does not know itself: no second copy of the record's figures), and
    # every rank loaded its input by the verification's receipt and the saved index: no byte
    # hashed and no id decoded a second time.
    assert {k for k in meta if k.startswith("pipes/")} == {
        "pipes/ranks_bytes_hashed",
        "pipes/ranks_ids_decoded",
    }
    assert meta["pipes/ranks_bytes_hashed"].value == 0
    assert meta["pipes/ranks_ids_decoded"].value == 0
    assert meta["world_size"].value == 2 and len(plain(meta["checkpoint_sha256"])) == 64
    # The killed attempt left the Pipes channel open for the restarted one: its messages
    # arrive as the run's own, not as warnings about a channel already closed.
    assert not [m for m in logs if "unexpected message" in m], logs
    # Rank 0's log lines reached the Dagster run.
    assert any("epoch 2/2" in m for m in logs), logs
    # Both attempts' ranks, on this one host's CPU, averaged their gradients in shared memory.
    averaged = [m for m in logs if m.startswith("gradients averaged")]
    assert averaged == ["gradients averaged in shared memory (2 ranks on one host)"] * 2, logs
    # The restarted rank 0 said where it resumed, through the same Pipes channel.
    said = "resumed after step 5 (cut on 2 rank(s), resumed on 2): epoch 1/2, 7 of"
    assert any(m.startswith(said) for m in logs), logs
    assert meta["resumed_after_step"].value == 5
    record = read_record(meta["record"].value)
    assert record.world_size == 2
    assert record.resumed is not None and record.resumed.step == 5
    interrupted = record.resumed.reconciliation
    assert interrupted.ok and interrupted.owners == 2, interrupted.problems()
    assert interrupted.duplicates == 0 and interrupted.missing == 0
    assert record.reconciliation.ok and record.reconciliation.owners == 2  # both ranks gathered
    manifest = result.asset_materializations_for_node("result_manifest")[0].metadata
    assert record.reconciliation.items_iterated == manifest["items"].value
    assert len(record.loss_curve) == 2


def test_an_attempt_that_raises_leaves_the_channel_open_for_torchruns_restart(
    tmp_path, labelled_samples, monkeypatch
):
    """Rank 0 raises in its first attempt (a transient error): torchrun restarts both ranks and
    the run succeeds, and the restarted attempt's messages are the run's own, not warnings that
    arrived "after closed" (the failed attempt did not close the channel a restart reuses)."""
    monkeypatch.setenv("FLAKY_TRAINER_MARKER", str(tmp_path / "failed"))
    resources = labelled_samples.resources(tmp_path, "wine", world_size=2, num_workers=0)
    config = TrainingConfig(
        trainer="tests.helpers.flaky_trainer:FailsOnce", epochs=1, batch_size=8, auto_features=True
    )
    result, logs = _materialize(
        resources,
        config,
        ["result_manifest", "verified_snapshot", "disjoint_index", "training_run"],
    )
    assert (tmp_path / "failed").exists(), "the first attempt was meant to fail"
    assert not [m for m in logs if "unexpected message" in m], logs
    assert any("epoch 1/1" in m for m in logs), logs
