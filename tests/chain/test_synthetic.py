"""The synthetic sample: any size, generated in batches, labelled by a linear-cost labeller.

Small N here; ``bench/chain.py`` runs the same code at 10^5..10^7 items.
"""

from __future__ import annotations

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from assets import CHAIN_ASSETS
from assets.training_run import TrainingConfig
from pipeline.bundle.verify import verify
from pipeline.defs import demo, samples
from pipeline.defs.samples import (
    SYNTHETIC_BATCH,
    SYNTHETIC_REFERENCE_ITEMS,
    stage_synthetic,
    synthetic_batches,
    synthetic_classes,
    synthetic_ids,
)
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute, worker
from resources.compute.local.labeller import fit_centroids, label_by_centroid
from tests.helpers.chain import chain_resources

ITEMS = SYNTHETIC_BATCH + 4_500  # crosses a batch boundary, so batching is exercised


def test_batches_are_bounded_deterministic_and_recomputable():
    batches = list(synthetic_batches(ITEMS, labelled=True))
    assert [b.num_rows for b in batches] == [SYNTHETIC_BATCH, 4_500]
    table = pa.Table.from_batches(batches)
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 64)
    assert table.schema.field("item_id").type == pa.string()
    assert table["item_id"][0].as_py() == "syn-0000000000"
    assert table["item_id"][ITEMS - 1].as_py() == f"syn-{ITEMS - 1:010d}"
    assert pc.count_distinct(table["item_id"]).as_py() == ITEMS
    # The same items every time, and any item's class is recomputed from its number alone.
    assert pa.Table.from_batches(synthetic_batches(ITEMS, labelled=True)).equals(table)
    labels = table["label"].to_numpy()
    assert np.array_equal(synthetic_classes(0, ITEMS), labels)
    assert np.array_equal(synthetic_classes(65_530, 65_540), labels[65_530:65_540])
    assert set(np.unique(labels)) == set(range(10))
    assert synthetic_ids(3, 5).to_pylist() == ["syn-0000000003", "syn-0000000004"]
    # A stop shorter than a batch gives only those items.
    (head,) = synthetic_batches(ITEMS, labelled=True, stop=10)
    assert pa.Table.from_batches([head]).equals(table.slice(0, 10).combine_chunks())
    # Another seed, other items.
    other = pa.Table.from_batches(synthetic_batches(100, seed=1))
    assert not other["embedding"].equals(table.slice(0, 100)["embedding"])


def test_classes_are_learnable_from_the_embedding():
    """Nearest class centre, estimated from the reference alone, recovers the true class."""
    (ref,) = synthetic_batches(SYNTHETIC_REFERENCE_ITEMS, labelled=True)
    x = ref.column("embedding").flatten().to_numpy().reshape(-1, 64).astype(np.float64)
    y = ref.column("label").to_numpy()
    model = fit_centroids(x[:2000], y[:2000], [64])
    out = label_by_centroid(x[2000:], model, abstain_margin=0.3)
    assert (out.label == y[2000:]).mean() > 0.9
    assert (out.status == "accepted").mean() > 0.8
    assert {"accepted", "abstained"} >= set(out.status)
    assert (out.verification == "agree").mean() > 0.9


def test_centroid_model_size_does_not_grow_with_the_reference():
    """The labeller keeps classes x features, whatever the reference size: per-item cost is
    fixed, so labelling is linear in the items (the kNN labeller keeps every reference row)."""
    (ref,) = synthetic_batches(SYNTHETIC_REFERENCE_ITEMS, labelled=True)
    x = ref.column("embedding").flatten().to_numpy().reshape(-1, 64).astype(np.float64)
    y = ref.column("label").to_numpy()
    small, large = fit_centroids(x[:500], y[:500], [64]), fit_centroids(x, y, [64])
    assert small.centroids.shape == large.centroids.shape == (10, 64)


def test_stage_synthetic_writes_verified_bundles_in_parts(tmp_path):
    inp, ref = stage_synthetic(ITEMS, tmp_path, rows_per_part=30_000)
    assert inp.manifest.counts.items == ITEMS
    assert [p.rows for p in inp.manifest.parts] == [30_000, 30_000, ITEMS - 60_000]
    assert ref.manifest.counts.items == SYNTHETIC_REFERENCE_ITEMS
    assert "label" in ref.manifest.schema_.names and "label" not in inp.manifest.schema_.names
    assert verify(inp.root).identity == inp.identity
    assert inp.manifest.schema_.field("embedding").type == "fixed_size_list<float32,64>"


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """A healthy synthetic job, labelled inline by the local Compute (centroid labeller)."""
    home = tmp_path_factory.mktemp("synthetic")
    job_id, compute = samples.submit_sample_job(
        samples.SYNTHETIC, home, FaultSpec(), job_id="syn-t", executor="inline", items=ITEMS
    )
    return home, job_id, compute


def test_local_compute_labels_every_item_streaming(labelled, monkeypatch, tmp_path):
    home, job_id, compute = labelled
    status = compute.status(job_id)
    assert status.state == "SUCCEEDED" and compute.jobs.load(job_id).spec.labeller == "centroid"
    snap = verify(compute.manifest_url(job_id))
    assert snap.manifest.counts.items == ITEMS and snap.manifest.counts.outstanding == 0
    assert len(snap.manifest.parts) == 2  # 65,536-row parts, not the default 256
    table = pa.concat_tables(pq.read_table(p) for p in snap.part_paths())
    numbers = pc.utf8_slice_codeunits(table["item_id"], 4).cast(pa.int64()).to_numpy()
    truth = synthetic_classes(0, ITEMS)[numbers]
    accepted = table["lithi_status"].to_numpy(zero_copy_only=False) == "accepted"
    assert accepted.mean() > 0.8
    label = table["lithi_label"].to_numpy(zero_copy_only=False)
    assert (label[accepted] == truth[accepted]).mean() > 0.95

    # A healthy job reads its input one row group at a time: only the (bounded) reference is
    # ever read whole. Run the same job again and record what is read whole.
    read_whole = []
    real = worker._read_table
    monkeypatch.setattr(
        worker, "_read_table", lambda snap: read_whole.append(snap.identity) or real(snap)
    )
    spec = compute.jobs.load(job_id).spec
    again = LocalCompute(tmp_path / "compute", "inline")
    again.submit(spec.model_copy(update={"job_id": "syn-again", "idempotency_key": None}))
    assert again.status("syn-again").state == "SUCCEEDED"
    ref_id = verify(spec.reference_url).identity
    assert read_whole == [ref_id]


def test_a_faulty_synthetic_job_still_goes_partial(tmp_path):
    """Faults that choose items from the whole id set still work (the in-memory path)."""
    job_id, compute = samples.submit_sample_job(
        samples.SYNTHETIC,
        tmp_path,
        FaultSpec(lose_fraction=0.1, fail_item_fraction=0.02),
        job_id="syn-p",
        executor="inline",
        items=5_000,
    )
    status = compute.status(job_id)
    assert status.state == "PARTIAL" and status.outstanding == 500
    m = verify(compute.manifest_url(job_id)).manifest
    assert m.counts.failed == round(0.02 * 4_500)


#: The chain's job: a few thousand items train the same way as the bench's millions (the size
#: that crosses a generation batch and a part is ITEMS, above; the chain over several parts is
#: tests/chain/test_chain.py's digits).
CHAIN_ITEMS = 8_000


def test_chain_trains_on_the_synthetic_sample(tmp_path):
    job_id, compute = samples.submit_sample_job(
        samples.SYNTHETIC,
        tmp_path,
        FaultSpec(),
        job_id="syn-c",
        executor="inline",
        items=CHAIN_ITEMS,
    )
    resources = chain_resources(tmp_path, job_id, compute_root=compute.root)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            CHAIN_ASSETS,
            resources=resources,
            run_config=dg.RunConfig(
                ops={
                    "training_run": TrainingConfig(epochs=2, batch_size=512, features=["embedding"])
                }
            ),
            instance=instance,
        )
    assert result.success
    meta = result.asset_materializations_for_node("training_run")[0].metadata
    assert meta["items_iterated"].value == CHAIN_ITEMS
    assert meta["holdout_accuracy"].value > 0.9
    table_path = result.asset_materializations_for_node("prediction_table")[0].metadata
    predictions = pq.read_table(table_path["table_path"].value)
    accuracy, n = samples.synthetic_truth_accuracy(predictions)
    assert n == CHAIN_ITEMS - SYNTHETIC_REFERENCE_ITEMS and accuracy > 0.9


def test_items_is_only_for_the_synthetic_sample(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LITHI_HOME", str(tmp_path / "home"))
    with pytest.raises(SystemExit) as e:
        demo.main(["--sample", "wine", "--items", "10"])
    assert e.value.code == 2
    assert "--items sizes the synthetic sample only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo.main(["--sample", "synthetic", "--items", "0"])
    assert not (tmp_path / "home").exists()
