"""Refuse a run at launch when its trainer config cannot work, before anything runs.

Dagster checks a run's config against the config's types when it is launched (the Launchpad,
a sensor, the CLI); the trainer's constraints (``epochs >= 1``, a positive learning rate) are
pydantic's, and its feature names are the bundle's, which Dagster only meets inside the run.
The project's instance (``pipeline/defs/dagster.yaml``) queues runs through
:class:`CheckedRunCoordinator`, which refuses such a launch in one line naming the field:

- every value a run's config gives a ``training_run`` op is checked against its trainer's
  ``Config`` (a field left out takes the chain's default, which was checked when the code
  location loaded; the defaults, the trainer's path included, are read from the run's job
  snapshot, so a run need not repeat them);
- when a run gives any trainer value, the whole config is checked by the trainer's own
  ``check`` against the schema of the bundle the chain's ``result_manifest`` last recorded
  (its ``dagster/column_schema``), as the step would check it before training. A chain that
  has read no manifest yet, or a run pinning another job or version, is checked by the step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster._config.snap import ConfigSchemaSnapshot
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.snap.job_snapshot import JobSnap
from dagster._core.storage.dagster_run import DagsterRun
from pydantic import BaseModel, ValidationError

from assets import _metadata as md
from assets.chain_keys import DEFAULT_CHAIN, chain_key
from pipeline.bundle.manifest import Schema
from pipeline.defs.run_labels import relabelled
from pipeline.training.trainer import TrainerError, load_trainer

TRAINER_FIELD = "trainer"
TRAINING_OP = "training_run"


class RunConfigRefused(ValueError):
    """A run's config gives a trainer a value the trainer refuses."""


@dataclass(frozen=True)
class RecordedSchema:
    """The bundle schema a chain's ``result_manifest`` last recorded, and which version it is."""

    schema: Schema
    id_field: str
    job_id: str
    version_id: str

    def describe(self, chain: str) -> str:
        """Where the schema came from, for the refusal line."""
        key = chain_key(chain, "result_manifest").to_user_string()
        return f"as {key} last read it: {self.job_id} version {self.version_id}"


#: A chain's recorded schema, or None where none is known.
SchemaLookup = Callable[[str], "RecordedSchema | None"]


def chain_link(op: str) -> tuple[str, str]:
    """The chain and link an op runs: ``digits__training_run`` is ``digits``'s
    ``training_run`` (Dagster names an asset's op after its key, ``/`` becoming ``__``)."""
    chain, sep, link = op.rpartition("__")
    return (chain if sep else DEFAULT_CHAIN), link


def trainer_defaults(job: JobSnap) -> dict[str, dict[str, Any]]:
    """Per op whose config has a ``trainer`` field (a ``training_run``), its config's defaults
    as the job was built with them: the chain's trainer and config."""
    schema: ConfigSchemaSnapshot = job.config_schema_snapshot
    root = schema.get_config_snap(job.mode_def_snaps[0].root_config_key)
    if "ops" not in root.field_names:
        return {}
    ops = schema.get_config_snap(root.get_field("ops").type_key)
    out: dict[str, dict[str, Any]] = {}
    for op in ops.field_names:
        op_snap = schema.get_config_snap(ops.get_field(op).type_key)
        if not op_snap.fields or "config" not in op_snap.field_names:
            continue
        config = schema.get_config_snap(op_snap.get_field("config").type_key)
        if not config.fields or TRAINER_FIELD not in config.field_names:
            continue
        out[op] = {
            name: json.loads(field.default_value_as_json_str)
            for name in config.field_names
            if (field := config.get_field(name)).default_value_as_json_str is not None
        }
    return out


def recorded_schema(instance: dg.DagsterInstance, chain: str) -> RecordedSchema | None:
    """The schema ``chain``'s ``result_manifest`` recorded last, or None."""
    event = instance.get_latest_materialization_event(chain_key(chain, "result_manifest"))
    mat = event.asset_materialization if event is not None else None
    if mat is None:
        return None
    meta = mat.metadata
    table = meta.get("dagster/column_schema")
    id_field = meta.get("item_id_field")
    if table is None or id_field is None:
        return None
    return RecordedSchema(
        schema=md.schema_of(table.value),
        id_field=str(id_field.value),
        job_id=str(meta["job_id"].value) if "job_id" in meta else "",
        version_id=str(meta["snapshot/version_id"].value) if "snapshot/version_id" in meta else "",
    )


def _reads_recorded(run_config: Mapping[str, Any], recorded: RecordedSchema) -> bool:
    """Whether a run reads the version ``recorded`` describes, as far as its config says: a
    run pinning another job or version reads a schema nobody has recorded yet."""
    for op, entry in (run_config.get("ops") or {}).items():
        if chain_link(op)[1] != "result_manifest" or not isinstance(entry, Mapping):
            continue
        given = entry.get("config") or {}
        if given.get("job_id") and given["job_id"] != recorded.job_id:
            return False
        if given.get("version_id") and given["version_id"] != recorded.version_id:
            return False
    return True


def config_problem(
    run_config: Mapping[str, Any],
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
    schemas: SchemaLookup | None = None,
) -> str | None:
    """One line naming the first trainer value ``run_config`` gives that its trainer refuses,
    or the first column the trainer's config cannot use in the chain's recorded schema; or
    None. ``defaults`` (see :func:`trainer_defaults`) fills what the run leaves out."""
    defaults = defaults or {}
    given_ops = run_config.get("ops") or {}
    for op in sorted(set(given_ops) | set(defaults)):
        entry = given_ops.get(op)
        given = entry.get("config") if isinstance(entry, Mapping) else None
        given = dict(given) if isinstance(given, Mapping) else {}
        if op not in defaults and TRAINER_FIELD not in given:
            continue  # not a training_run: only it carries the trainer's import path
        values = {**defaults.get(op, {}), **given}
        path = values.pop(TRAINER_FIELD, None)
        given.pop(TRAINER_FIELD, None)
        if not given and path == defaults.get(op, {}).get(TRAINER_FIELD):
            continue  # the chain's own trainer and config, checked when the location loaded
        try:
            trainer = load_trainer(path)
        except TrainerError as e:
            return f"{op}: {e}"
        config = trainer.Config
        params: Any = values  # what the trainer's check takes: its Config, or the dict
        if config is not None and issubclass(config, BaseModel):
            try:
                params = config.model_validate(values)
            except ValidationError as e:
                for err in e.errors():
                    field = err["loc"][0] if err["loc"] else None
                    if field in given:  # a value the run gave, not one it left to the chain
                        return f"{op}: {field}={given[field]!r} is refused by {path}: {err['msg']}"
                return None  # a default the run cannot change; the step says so
        chain = chain_link(op)[0]
        recorded = schemas(chain) if schemas is not None else None
        if recorded is None or not _reads_recorded(run_config, recorded):
            continue
        try:
            trainer.check(params, recorded.schema, recorded.id_field)
        except TrainerError as e:
            return f"{op}: {e}; the bundle {recorded.describe(chain)}"
    return None


class CheckedRunCoordinator(QueuedRunCoordinator):
    """Dagster's queued run coordinator, labelling a re-execution as one (the tags it copied
    from its parent say what started the parent) and refusing a run whose trainer config cannot work
    (see the module doc) before it is queued: the launch fails with that line, the run is
    marked failed, and nothing runs or retries."""

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        """Label a re-execution as one, check, then queue."""
        run = context.dagster_run
        instance = self._instance
        label = relabelled(run.tags)
        if label:  # on the Runs page from the moment it is launched (see run_labels)
            instance.add_run_tags(run.run_id, label)
        job = instance.get_job_snapshot(run.job_snapshot_id) if run.job_snapshot_id else None
        problem = config_problem(
            run.run_config or {},
            trainer_defaults(job) if job is not None else None,
            lambda chain: recorded_schema(instance, chain),
        )
        if problem is not None:
            # the run is marked failed by the instance; a retry would be refused the same way
            instance.add_run_tags(run.run_id, {"dagster/max_retries": "0"})
            raise RunConfigRefused(problem)
        return super().submit_run(context)
