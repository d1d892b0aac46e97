"""Refuse a run at launch when a trainer setting it names breaks the trainer's own constraints.

Dagster checks a run's config against the config's types when it is launched (the Launchpad,
a sensor, the CLI); the trainer's constraints (``epochs >= 1``, a positive learning rate) are
pydantic's, which Dagster only meets inside the run. The project's instance
(``pipeline/defs/dagster.yaml``) queues runs through :class:`CheckedRunCoordinator`, which
checks every value a run's config gives ``training_run`` against its trainer's ``Config`` first,
and refuses the launch in one line naming the field. Only the values the run gives are judged:
a field left out takes the chain's default, which was checked when the code location loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.storage.dagster_run import DagsterRun
from pydantic import BaseModel, ValidationError

from pipeline.training.trainer import TrainerError, load_trainer


class RunConfigRefused(ValueError):
    """A run's config gives a trainer a value the trainer refuses."""


def config_problem(run_config: Mapping[str, Any]) -> str | None:
    """One line naming the first trainer field ``run_config`` sets to a value its trainer
    refuses, or None."""
    for op, entry in (run_config.get("ops") or {}).items():
        given = entry.get("config") if isinstance(entry, Mapping) else None
        if not isinstance(given, Mapping) or "trainer" not in given:
            continue  # not a training_run: only it carries the trainer's import path
        values = dict(given)
        path = values.pop("trainer")
        try:
            config = load_trainer(path).Config
        except TrainerError as e:
            return f"{op}: {e}"
        if config is None or not issubclass(config, BaseModel):
            continue
        try:
            config.model_validate(values)
        except ValidationError as e:
            for err in e.errors():
                field = err["loc"][0] if err["loc"] else None
                if field in values:  # a value the run gave, not one it left to the chain
                    return f"{op}: {field}={values[field]!r} is refused by {path}: {err['msg']}"
    return None


class CheckedRunCoordinator(QueuedRunCoordinator):
    """Dagster's queued run coordinator, refusing a run whose trainer config its trainer
    refuses before it is queued (the launch fails with that line; nothing runs or retries)."""

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        """Check, then queue."""
        run = context.dagster_run
        problem = config_problem(run.run_config or {})
        if problem is not None:
            # the run is marked failed by the instance; a retry would be refused the same way
            self._instance.add_run_tags(run.run_id, {"dagster/max_retries": "0"})
            raise RunConfigRefused(problem)
        return super().submit_run(context)
