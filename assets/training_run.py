"""``training_run``: a torch model trained on the disjoint index, with a record beside it.

The record names the exact data (snapshot identity, index digest) that produced the checkpoint,
so the checkpoint can be reproduced rather than only re-attempted.
"""

import os
import sys
from pathlib import Path

import dagster as dg
import pydantic

from assets import _charts as charts
from assets import _metadata as md
from assets._group import CHAIN_GROUP
from assets.refs import IndexRef, TrainingRef, load_index
from pipeline.readers.index import Index
from pipeline.training.fit import TrainConfig, TrainSummary, fit
from pipeline.training.model import save_checkpoint
from pipeline.training.record import TrainingRecord, write_record
from resources.dagster_resources import BundleStoreResource
from resources.settings import ChainSettings

RECONCILES = "iterated_counts_reconcile"


#: The run config of ``training_run``: the trainer's own config model, field for field (Dagster
#: validates it at launch), except ``num_workers``, which comes from ``ChainSettings``.
TrainingConfig: type[dg.Config] = pydantic.create_model(
    "TrainingConfig",
    __base__=dg.Config,
    __doc__=TrainConfig.__doc__,
    **{n: (f.annotation, f) for n, f in TrainConfig.model_fields.items() if n != "num_workers"},
)


def _train_in_process(index: Index, config: TrainConfig, out: Path, log) -> TrainSummary:
    outcome = fit(index, config, rank=0, world_size=1, log=log)
    digest = save_checkpoint(
        out / "model.pt",
        state_dict=outcome.state_dict,
        spec=outcome.spec,
        config=config.model_dump(),
        hidden=config.hidden,
    )
    return TrainSummary.of(outcome, digest, 1)


def _train_torchrun(
    context,
    pipes: dg.PipesSubprocessClient,
    ref: IndexRef,
    config: TrainConfig,
    world: int,
    out: Path,
) -> tuple[TrainSummary, dict]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(world), "-m", "pipeline.defs.train_launch",
        "--bundle", ref.snapshot.path, "--index", ref.path,
        "--config", config.model_dump_json(), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    invocation = pipes.run(command=cmd, context=context, env=env)
    reported: dict = {}
    for result in invocation.get_results():
        reported.update({f"pipes/{k}": v for k, v in (result.metadata or {}).items()})
    return TrainSummary.model_validate_json((out / "outcome.json").read_text()), reported


@dg.asset(
    group_name=CHAIN_GROUP,
    kinds={"pytorch"},
    code_version="1",
    description="A classifier trained on your hardware from the disjoint index: accepted rows, "
    "weighted by confidence (both configurable). world_size 1 trains in the step's process; more "
    "ranks run as real torchrun processes through Dagster Pipes. Writes the checkpoint and, "
    "beside it, a record of the training snapshot, index digest, config and metrics.",
    check_specs=[
        dg.AssetCheckSpec(
            RECONCILES,
            asset="training_run",
            description="Items iterated equal the manifest's, by status (accepted, failed, "
            "abstained), with no id seen twice; outstanding items are carried in the report.",
        )
    ],
)
def training_run(
    context: dg.AssetExecutionContext,
    config: TrainingConfig,
    disjoint_index: IndexRef,
    bundle_store: BundleStoreResource,
    chain_settings: ChainSettings,
    pipes_subprocess_client: dg.PipesSubprocessClient,
):
    """Train, checkpoint, and write the record beside the checkpoint."""
    train_config = TrainConfig(**config.model_dump(), num_workers=chain_settings.num_workers)
    out = chain_settings.artifacts() / "training_run" / context.run.run_id
    out.mkdir(parents=True, exist_ok=True)
    world = chain_settings.world_size
    index = load_index(disjoint_index, bundle_store.store().trusted)
    snapshot = index.snapshot
    reported: dict = {}
    if world == 1:
        outcome = _train_in_process(index, train_config, out, context.log.info)
    else:
        outcome, reported = _train_torchrun(
            context, pipes_subprocess_client, disjoint_index, train_config, world, out
        )
    report = outcome.reconciliation.as_dict()
    record = TrainingRecord(
        snapshot=snapshot.identity,
        index_sha256=index.digest,
        index_path=disjoint_index.path,
        checkpoint_file="model.pt",
        checkpoint_sha256=outcome.checkpoint_sha256,
        config=train_config.model_dump(),
        world_size=world,
        metrics=outcome.metrics,
        loss_curve=outcome.loss_curve,
        reconciliation=report,
    )
    record_path = write_record(out, record)
    svg = charts.loss_svg(outcome.loss_curve, out / "loss.svg")
    yield dg.AssetCheckResult(
        check_name=RECONCILES,
        passed=bool(report["ok"]),
        metadata={k: v for k, v in report.items() if isinstance(v, (int, float, str, bool))},
    )
    metrics = outcome.metrics
    yield dg.Output(
        TrainingRef(
            checkpoint=str(out / "model.pt"),
            checkpoint_sha256=outcome.checkpoint_sha256,
            record=str(record_path),
            index=disjoint_index,
        ),
        metadata={
            **md.identity("snapshot", snapshot.identity),
            "index_sha256": index.digest,
            "checkpoint_sha256": outcome.checkpoint_sha256,
            "checkpoint": dg.MetadataValue.path(str(out / "model.pt")),
            "record": dg.MetadataValue.path(str(record_path)),
            "record_json": dg.MetadataValue.json(record.model_dump(mode="json")),
            "loss_curve_chart": dg.MetadataValue.md(charts.svg_markdown(svg)),
            "loss_curve": dg.MetadataValue.md(charts.loss_markdown(outcome.loss_curve)),
            "loss_curve_svg": dg.MetadataValue.path(str(svg)),
            "final_loss": float(outcome.loss_curve[-1]),
            "holdout_accuracy": float(metrics["holdout_accuracy"]),
            "train_accuracy": float(metrics["train_accuracy"]),
            "world_size": world,
            "items_iterated": int(report["items_iterated"]),
            **reported,
        },
        data_version=dg.DataVersion(outcome.checkpoint_sha256),
    )
