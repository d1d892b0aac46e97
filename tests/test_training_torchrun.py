"""world_size 2: training runs as real torchrun processes launched through Dagster Pipes."""

import dagster as dg
import pytest

from assets import CHAIN_ASSETS
from assets._metadata import plain
from assets.training_run import TrainingConfig
from pipeline.training.record import read_record


@pytest.mark.integration
def test_training_through_torchrun_via_pipes_reconciles(tmp_path, labelled_samples):
    resources = labelled_samples.resources(tmp_path, "wine", world_size=2, num_workers=1)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            CHAIN_ASSETS,
            resources=resources,
            run_config=dg.RunConfig(
                ops={"training_run": TrainingConfig(epochs=2, auto_features=True)}
            ),
            instance=instance,
        )
        assert result.success
        logs = [
            e.message
            for e in instance.all_logs(result.run_id)
            if e.user_message and "epoch" in e.user_message
        ]
    meta = result.asset_materializations_for_node("training_run")[0].metadata
    # Metadata reported from inside the torchrun process came back through the Pipes channel
    # (only what the step does not know itself: no second copy of the record's figures).
    assert {k for k in meta if k.startswith("pipes/")} == {"pipes/ranks_bytes_hashed"}
    assert meta["world_size"].value == 2 and len(plain(meta["checkpoint_sha256"])) == 64
    record = read_record(meta["record"].value)
    assert record.world_size == 2
    assert record.reconciliation.ok is True
    assert record.reconciliation.owners == 2  # both ranks' counts were gathered
    manifest = result.asset_materializations_for_node("result_manifest")[0].metadata
    assert record.reconciliation.items_iterated == manifest["items"].value
    # Each rank verified the bundle with the cache's trust: no rank hashed a byte of it again.
    assert meta["pipes/ranks_bytes_hashed"].value == 0
    # Rank 0's log lines reached the Dagster run.
    assert any("epoch 2/2" in m for m in logs)
