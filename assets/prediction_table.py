"""``prediction_table``: one prediction for every item of the index, keyed by the same id."""

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from assets import _metadata as md
from assets._group import CHAIN_GROUP
from assets.refs import PredictionRef, TrainingRef, load_index
from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import atomic_write_bytes
from pipeline.bundle.manifest import Schema
from pipeline.training.predict import predict
from resources.dagster_resources import BundleStoreResource
from resources.settings import ChainSettings

ONE_ROW_PER_ITEM = "one_row_per_item"


@dg.asset(
    group_name=CHAIN_GROUP,
    kinds={"pytorch", "parquet"},
    code_version="1",
    description="Predictions for every item of the index, failed and abstained items included, "
    "keyed by the same string id, with the prediction, its score and the checkpoint digest.",
    check_specs=[
        dg.AssetCheckSpec(
            ONE_ROW_PER_ITEM,
            asset="prediction_table",
            blocking=True,
            description="Exactly one row per index item: same ids, no duplicates, none missing.",
        )
    ],
)
def prediction_table(
    context: dg.AssetExecutionContext,
    training_run: TrainingRef,
    bundle_store: BundleStoreResource,
    chain_settings: ChainSettings,
):
    """Predict with the checkpoint over the whole index and write the table as Parquet."""
    ref = training_run.index
    index = load_index(ref, bundle_store.store().trusted)
    snapshot = index.snapshot
    table = predict(index, training_run.checkpoint)
    out = chain_settings.artifacts() / "prediction_table" / context.run.run_id
    out.mkdir(parents=True, exist_ok=True)
    path = out / "predictions.parquet"
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(path, sink.getvalue().to_pybytes(), replace=False)
    ids = table.column(index.id_field)
    same = ids.combine_chunks().equals(index.ids)
    unique = pc.count_distinct(ids).as_py() == len(ids)
    yield dg.AssetCheckResult(
        check_name=ONE_ROW_PER_ITEM,
        passed=bool(same and unique and len(ids) == len(index)),
        metadata={"rows": len(ids), "items": len(index), "unique_ids": unique, "same_ids": same},
    )
    by_status = {
        r["values"]: r["counts"]
        for r in pc.value_counts(table.column(fmt.STATUS_COLUMN)).to_pylist()
    }
    yield dg.Output(
        PredictionRef(
            path=str(path), rows=table.num_rows, id_field=index.id_field, training=training_run
        ),
        metadata={
            "dagster/row_count": table.num_rows,
            "dagster/column_schema": md.column_schema(
                Schema.from_arrow(table.schema), index.id_field
            ),
            **md.identity("snapshot", snapshot.identity),
            "checkpoint_sha256": training_run.checkpoint_sha256,
            "table_path": dg.MetadataValue.path(str(path)),
            **{f"rows_{k}": v for k, v in by_status.items()},
        },
    )
