"""``prediction_table``: the trainer's prediction for every item of the index, keyed by its id."""

import dagster as dg
import pyarrow as pa

from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from pipeline.bundle.manifest import Schema
from pipeline.readers.reconcile import keyed_coverage
from pipeline.training.device import choose_device
from pipeline.training.memory import frozen_heap
from pipeline.training.predictions import PredictionFile, write_predictions
from pipeline.training.record import TrainedModel
from pipeline.training.trainer import PredictContext, load_trainer
from resources.dagster.artifacts import ArtifactStore
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.io_manager import TABLE_NAME


@dg.asset(
    group_name=CHAIN_GROUP,
    io_manager_key=IO_MANAGER_KEY,
    kinds={"pytorch", "parquet"},
    code_version="6",
)
def prediction_table(
    context: dg.AssetExecutionContext,
    training_run: TrainedModel,
    chain_settings: ChainSettings,
    artifacts: ArtifactStore,
) -> dg.Output[PredictionFile]:
    """Predictions for every item of the index — failed and abstained items included — made by
    the trainer that wrote the checkpoint, with its own config, keyed by the same string id.
    Written to Parquet in row groups as the trainer yields them, never held whole."""
    index = training_run.index
    record = training_run.record
    trainer = load_trainer(record.trainer.path)
    ctx = PredictContext(
        index=index,
        config=trainer.parse_config(record.config),
        num_workers=chain_settings.num_workers,
        log=context.log.info,
        device=choose_device(chain_settings.device),
        checkpoint_dir=training_run.checkpoint_dir,
        checkpoint_sha256=record.checkpoint.sha256,
    )
    with frozen_heap():  # a pass over millions of items: see pipeline.training.memory
        predictions = write_predictions(
            trainer.predict(ctx),
            artifacts.directory(context) / TABLE_NAME,
            id_field=index.id_field,
            trainer=record.trainer.path,
        )
    meta = {
        "dagster/row_count": predictions.rows,
        "dagster/column_schema": md.column_schema(
            Schema.from_arrow(predictions.schema), index.id_field
        ),
        **md.identity("snapshot", index.snapshot.identity),
        "checkpoint_sha256": md.digest(record.checkpoint.sha256),
        **ctx.metadata,  # what the trainer says of its predictions (values filled, unseen)
        **predictions.by_status,  # named as result_manifest names its counts
    }
    return dg.Output(predictions, metadata=meta)


@dg.asset_check(
    asset=prediction_table,
    additional_ins={"training_run": dg.AssetIn("training_run")},
    blocking=True,
    description="Exactly one row per index item, keyed by the same string id: no duplicates, "
    "none missing, none extra (each named when it fails).",
)
def one_row_per_item(
    prediction_table: PredictionFile, training_run: TrainedModel
) -> dg.AssetCheckResult:
    """Match the table's id column (read alone) against the training index."""
    index = training_run.index
    ids = prediction_table.column(index.id_field).cast(pa.string())
    coverage = keyed_coverage(index.ids, ids)
    return dg.AssetCheckResult(
        passed=coverage.ok,
        metadata={
            "rows": coverage.rows,
            "items": coverage.items,
            "problems": "\n".join(coverage.problems()) or "none",
        },
    )
