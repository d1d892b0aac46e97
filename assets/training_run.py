"""``training_run``: a trainer run over the disjoint index, with a record beside its checkpoint.

The trainer is any :class:`~pipeline.training.Trainer`, chosen by import path (``LITHI_TRAINER``
for the code location, ``trainer`` in the run config for one run); its config model becomes the
run config, so Dagster validates every field at launch. The pipeline, never the trainer, hashes
the checkpoint, reconciles what the readers yielded and writes the record naming the exact data
(snapshot identity, index digest) and code (trainer path, version, source digest).
"""

import json
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import pydantic

from assets import _charts as charts
from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from assets._refusal import refusal
from pipeline.readers.index import Index
from pipeline.tethered import tethered
from pipeline.training.device import choose_device
from pipeline.training.record import (
    CHECKPOINT_DIR,
    TrainedModel,
    TrainingRecord,
    record_text,
    write_record,
)
from pipeline.training.runner import OUTCOME, TrainSummary, progress_key, train_once
from pipeline.training.threads import intra_op_threads, torch_threads
from pipeline.training.trainer import (
    REFERENCE_TRAINER,
    Trainer,
    TrainerError,
    load_trainer,
    trainer_info,
)
from resources.bundle_store import BundleStore
from resources.dagster.artifacts import ArtifactStore
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource

# What the torchrun ranks report of their own cost to load the input.
RANK_COSTS = ("pipes/ranks_bytes_hashed", "pipes/ranks_ids_decoded")
# What the Ray job reports of its attempts: how many, and the world size of each.
RAY_REPORTS = ("pipes/attempts", "pipes/world_sizes")


def training_config_class(trainer_path: str, defaults: Mapping[str, Any] | None = None) -> type:
    """The run config of ``training_run`` for the trainer at ``trainer_path``.

    Field for field the trainer's ``Config`` model (Dagster validates types and enums at launch),
    with ``defaults`` (``LITHI_TRAINER_CONFIG``) as the defaults, plus ``trainer`` — the import
    path, which one run may change. A trainer without a ``Config`` takes any fields.
    """
    trainer = load_trainer(trainer_path)
    defaults = dict(defaults or {})
    trainer.parse_config(defaults)  # refuses bad defaults now, with the trainer's own message
    path_field = (
        str,
        pydantic.Field(default=trainer_path, description="import path of the Trainer to run"),
    )
    if trainer.Config is None:
        return pydantic.create_model(
            "TrainingConfig", __base__=dg.PermissiveConfig, trainer=path_field
        )
    fields: dict[str, Any] = {"trainer": path_field}
    for name, f in trainer.Config.model_fields.items():
        # types and defaults only: Dagster checks the types at launch, and the trainer's own
        # constraints (epochs >= 1, say) are checked by the step with the trainer's message,
        # not by Dagster building this object before the step, in a stack trace it retries
        kept: dict[str, Any] = {"description": f.description}
        if name in defaults:
            kept["default"] = defaults[name]
        elif f.default_factory is not None:
            kept["default_factory"] = f.default_factory
        elif not f.is_required():
            kept["default"] = f.default
        fields[name] = (f.annotation, pydantic.Field(**kept))
    return pydantic.create_model(
        "TrainingConfig", __base__=dg.Config, __doc__=trainer.Config.__doc__, **fields
    )


def _threads_per_rank(settings: ChainSettings) -> int:
    """``LITHI_TORCH_THREADS``, else each rank's share of the cores (all ranks run here)."""
    return settings.torch_threads or intra_op_threads(settings.world_size, settings.num_workers)


def _train_in_process(
    trainer: Trainer,
    index: Index,
    config: dict,
    out: Path,
    settings: ChainSettings,
    progress_dir: Path,
    log,
) -> TrainSummary:
    with torch_threads(_threads_per_rank(settings)):
        summary = train_once(
            trainer,
            index,
            config,
            out,
            num_workers=settings.num_workers,
            log=log,
            progress_dir=progress_dir,
            checkpoint_every=settings.checkpoint_every,
            device=choose_device(settings.device),
        )
    assert summary is not None  # rank 0 of 1
    return summary


def _train_torchrun(
    context: dg.AssetExecutionContext,
    pipes: dg.PipesSubprocessClient,
    trainer_path: str,
    index: Index,
    store: BundleStore,
    config: dict,
    settings: ChainSettings,
    progress_dir: Path,
    out: Path,
) -> tuple[TrainSummary, dict]:
    """Train with real torchrun ranks; each verifies the bundle with the cache's trust (by its
    receipt) and loads the saved index (or rebuilds it), which must have the digest this step
    was handed. When a rank dies,
    torchrun restarts every rank (up to ``torchrun_max_restarts`` times) and they resume from
    the last mid-fit cut in ``progress_dir``."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(settings.world_size),
        "--max-restarts", str(settings.torchrun_max_restarts),
        "-m", "pipeline.defs.train_launch",
        "--bundle", str(index.snapshot.root), "--cache-dir", str(store.cache_dir),
        *(["--rehash"] if store.rehash else []),
        "--index-sha256", index.digest,
        *(["--index", index.saved_at] if index.saved_at else []),
        "--trainer", trainer_path,
        "--config", json.dumps(config), "--num-workers", str(settings.num_workers),
        "--device", settings.device,
        "--progress-dir", str(progress_dir),
        "--checkpoint-every", str(settings.checkpoint_every), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(_threads_per_rank(settings))}
    # tethered: torchrun and its ranks die with this step, however it is killed
    invocation = pipes.run(command=tethered(cmd), context=context, env=env)
    reported: dict = {}
    for result in invocation.get_results():
        reported.update({f"pipes/{k}": v for k, v in (result.metadata or {}).items()})
    return TrainSummary.model_validate_json((out / OUTCOME).read_text()), reported


def _train_ray(
    context: dg.AssetExecutionContext,
    trainer_path: str,
    index: Index,
    store: BundleStore,
    config: dict,
    settings: ChainSettings,
    key: str,
    out: Path,
) -> tuple[TrainSummary, dict]:
    """Train on the Ray cluster at ``RAY_ADDRESS``: a Ray job (``pipeline.defs.ray_launch``)
    submitted through ``dagster-ray``'s Pipes client places the ranks over the cluster's nodes.
    They share no disk with this step: the verified bundle and the saved index are published
    to ``ray_artifacts_url`` first, and the checkpoint and outcome come back from there,
    checked against their digests."""
    try:
        from dagster_ray import PipesRayJobClient
    except ImportError:
        raise dg.Failure(
            "LITHI_LAUNCHER=ray needs Ray and dagster-ray: pip install 'lithi-train[ray]'"
        ) from None
    from resources.run_exchange import RunExchange, collect_outcome, heartbeat, publish_inputs

    if not os.environ.get("RAY_ADDRESS"):
        raise dg.Failure(
            "LITHI_LAUNCHER=ray needs RAY_ADDRESS: the job server of the Ray cluster to train on "
            "(http://HEAD:8265)"
        )
    if not settings.ray_artifacts_url:
        raise dg.Failure(
            "LITHI_LAUNCHER=ray needs LITHI_RAY_ARTIFACTS_URL: a URL (s3://bucket/prefix, or a "
            "path) that every Ray node and this step can read and write"
        )
    ref = settings.ray_credential_ref or None
    exchange = RunExchange(
        settings.ray_artifacts_url, context.run.run_id, index.snapshot.identity.version_id, key
    )
    publish_inputs(store, exchange, index.snapshot, index, ref)
    args = [
        "--exchange-url", exchange.url, "--run-id", exchange.run_id,
        "--version-id", exchange.version_id, "--progress-key", key,
        "--index-sha256", index.digest, "--trainer", trainer_path,
        "--config", json.dumps(config), "--workers", str(settings.world_size),
        "--num-workers", str(settings.num_workers), "--device", settings.device,
        "--checkpoint-every", str(settings.checkpoint_every),
        "--max-restarts", str(settings.ray_max_restarts),
        "--cpus-per-worker", str(settings.ray_worker_cpus),
        "--gpus-per-worker", str(settings.ray_worker_gpus),
        *(["--credential-ref", ref] if ref else []),
        "--tether-url", exchange.heartbeat_url,
        "--tether-timeout", str(settings.ray_tether_seconds),
        "--rank-wait", str(settings.ray_rank_wait_seconds),
    ]  # fmt: skip
    entrypoint = shlex.join([settings.ray_python, "-m", "pipeline.defs.ray_launch", *args])
    threads = settings.torch_threads or 1
    client = PipesRayJobClient(poll_interval=0.5)
    # The job stops by itself once this step is gone, however it goes (SIGKILL included):
    # dagster-ray stops it on an interruption it sees, the heartbeat covers the rest.
    every = settings.ray_tether_seconds / 6
    with heartbeat(store, exchange.heartbeat_url, every, ref):
        invocation = client.run(
            context=context,
            submit_job_params={
                "entrypoint": entrypoint,
                "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(threads)}},
            },
        )
    reported: dict = {}
    for result in invocation.get_results():
        reported.update({f"pipes/{k}": v for k, v in (result.metadata or {}).items()})
    url = md.plain(reported["pipes/outcome_url"]) if "pipes/outcome_url" in reported else None
    if not url:
        raise dg.Failure("the Ray job ended without naming its outcome (pipes/outcome_url)")
    return collect_outcome(store, str(url), out, ref), reported


def _tag_run(context: dg.AssetExecutionContext, trainer_path: str, config: Any) -> None:
    """Name the trainer and its effective config on the run (``lithi/trainer``,
    ``lithi/trainer_config``): a run started from the CLI or a sensor carries no run config of
    its own, so without these the runs list cannot tell which model a run trained."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    md.tag_run(context, {"lithi/trainer": trainer_path, "lithi/trainer_config": text})


def training_run_asset(
    trainer_path: str = REFERENCE_TRAINER,
    defaults: Mapping[str, Any] | None = None,
    chain: str = "",
) -> dg.AssetsDefinition:
    """The ``training_run`` asset for the trainer at ``trainer_path`` (see the module doc).

    A named ``chain``'s is keyed ``<chain>/training_run`` with its op named after it: each
    chain's config is its own op's, and a code location's ops need distinct names. (Its input
    is still ``disjoint_index``'s key; :func:`assets.chain_assets` renames that.)
    """
    TrainingConfig = training_config_class(trainer_path, defaults)  # noqa: N806

    @dg.asset(
        name="training_run",
        key_prefix=[chain] if chain else None,
        group_name=chain or CHAIN_GROUP,
        io_manager_key=IO_MANAGER_KEY,
        kinds={"pytorch"},
        code_version="4",
    )
    def training_run(
        context: dg.AssetExecutionContext,
        config: TrainingConfig,  # type: ignore[valid-type]
        disjoint_index: Index,
        chain_settings: ChainSettings,
        artifacts: ArtifactStore,
        bundle_store: BundleStoreResource,
        pipes_subprocess_client: dg.PipesSubprocessClient,
    ):
        """A model trained on your hardware from the disjoint index by the configured trainer
        (the reference MLP unless told otherwise). world_size 1 trains in the step's process;
        more ranks run as real torchrun processes through Dagster Pipes. Beside the checkpoint,
        a record of the training snapshot, index digest, trainer, config, features and metrics,
        written once."""
        values = config.model_dump()
        path = values.pop("trainer")
        index = disjoint_index
        try:  # against the manifest's schema, before anything is read or launched
            trainer = load_trainer(path)
            params = trainer.parse_config(values)
            trainer.check(params, index.schema, index.id_field)
        except TrainerError as e:  # the same config would fail the same way: not retried
            raise refusal(context, str(e)) from None
        params_data = params.model_dump(mode="json") if hasattr(params, "model_dump") else params
        _tag_run(context, path, params_data)
        out = artifacts.directory(context)
        world = chain_settings.world_size
        key = progress_key(index, path, params_data)  # any shape resumes its cuts
        progress_dir = artifacts.progress(context.asset_key, key)
        reported: dict = {}
        if world == 1:
            summary = _train_in_process(
                trainer, index, params_data, out, chain_settings, progress_dir, context.log.info
            )
        elif chain_settings.launcher == "ray":
            summary, reported = _train_ray(
                context, path, index, bundle_store.store(), params_data, chain_settings, key, out
            )
        else:
            summary, reported = _train_torchrun(
                context,
                pipes_subprocess_client,
                path,
                index,
                bundle_store.store(),
                params_data,
                chain_settings,
                progress_dir,
                out,
            )
        report = summary.reconciliation
        record = TrainingRecord(
            snapshot=index.snapshot.identity,
            index_sha256=index.digest,
            trainer=trainer_info(path, trainer),
            config=params_data,
            features=summary.features,
            world_size=summary.world_size,
            device=summary.device,
            checkpoint=summary.checkpoint,
            metrics=summary.metrics,
            loss_curve=summary.loss_curve,
            reconciliation=report,
            passes=summary.passes,
            resumed=summary.resumed,
        )
        record_path = write_record(out, record)
        md.tag_run(context, {"lithi/checkpoint_sha256": record.checkpoint.sha256})
        meta: dict[str, Any] = {
            **md.identity("snapshot", index.snapshot.identity),
            "index_sha256": md.digest(index.digest),
            "trainer": record.trainer.path,
            "trainer_version": record.trainer.version or "unknown",
            "trainer_config": dg.MetadataValue.json(params_data),
            "checkpoint_sha256": md.digest(record.checkpoint.sha256),
            "checkpoint": dg.MetadataValue.path(str(out / CHECKPOINT_DIR)),
            "record": dg.MetadataValue.path(str(record_path)),
            "record_json": dg.MetadataValue.json(json.loads(record_text(record))),
            "features": md.features_table(record.features),
            **md.missing_values(record.features),
            **{k: md.metric(v) for k, v in record.metrics.items()},
            "world_size": summary.world_size,
            # the world size of the cut a killed fit resumed from (0: it ran through in one go)
            "resumed_from_world_size": (summary.resumed.world_size or 0) if summary.resumed else 0,
            "launcher": "in process" if world == 1 else chain_settings.launcher,
            "device": summary.device,
            "torch_threads": _threads_per_rank(chain_settings),  # per rank
            "items_iterated": report.items_iterated,
            # The step a killed fit resumed after (0: it ran through in one go).
            "resumed_after_step": summary.resumed.step if summary.resumed else 0,
            # What the torchrun ranks hashed and decoded to load their input (0: the receipt
            # and the saved index vouched).
            **{k: v for k, v in reported.items() if k in RANK_COSTS or k in RAY_REPORTS},
        }
        if summary.loss_curve:
            svg = charts.loss_svg(summary.loss_curve, out / "loss.svg")
            meta["loss_curve"] = dg.MetadataValue.md(charts.svg_markdown(svg))
            meta["final_loss"] = md.metric(summary.loss_curve[-1])
        return dg.Output(
            TrainedModel(index, out, record),
            metadata=meta,
            data_version=dg.DataVersion(record.checkpoint.sha256),
        )

    return training_run


@dg.asset_check(
    asset="training_run",
    blocking=True,
    description="What the trainer's last full pass over the readers yielded accounts for the "
    "manifest exactly once: items and counts by status (accepted, failed, abstained), no id "
    "seen twice, none missing; outstanding items are carried in the report.",
)
def iterated_counts_reconcile(training_run: TrainedModel) -> dg.AssetCheckResult:
    """Read the reconciliation the pipeline recorded beside the checkpoint."""
    record = training_run.record
    report = record.reconciliation
    return dg.AssetCheckResult(
        passed=report.ok,
        metadata={
            "items_expected": report.items_expected,
            "items_iterated": report.items_iterated,
            **{f"{s}_expected": n for s, n in report.by_status_expected.items()},
            **{f"{s}_iterated": n for s, n in report.by_status_found.items()},
            "outstanding": report.outstanding,
            "duplicates": report.duplicates,
            "missing": report.missing if report.missing is not None else "not checked",
            "owners": report.owners,
            "passes": record.passes,
            "problems": "\n".join(report.problems()) or "none",
        },
    )


#: The reference trainer's run config (what tests and scripts build run configs from).
TrainingConfig = training_config_class(REFERENCE_TRAINER)

training_run = training_run_asset()
