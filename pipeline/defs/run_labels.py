"""What a re-executed run says started it.

Dagster copies a run's tags into its re-executions and retries, so a chain run re-executed from
the UI would still read ``lithi/trigger: newer_manifest``, as if the sensor had launched it. Such
a run is relabelled ``reexecution`` (a person, from the UI or the CLI) or ``retry`` (the daemon's
run retries), keeping what started the run it re-executes in ``lithi/first_trigger``: by the
project's run coordinator as it is launched (``launch_check``), and, on an instance without it,
by a hook on the chain jobs once a step of the run ends.
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

PARENT_RUN_TAG = "dagster/parent_run_id"
RETRY_NUMBER_TAG = "dagster/retry_number"  # set by the daemon on the runs it retries


def relabelled(tags: Mapping[str, str]) -> dict[str, str]:
    """The tags to add to a run with ``tags`` (none for a first run, or one already relabelled)."""
    if PARENT_RUN_TAG not in tags:
        return {}
    trigger = "retry" if RETRY_NUMBER_TAG in tags else "reexecution"
    if tags.get("lithi/trigger") == trigger:
        return {}
    first = tags.get("lithi/first_trigger") or tags.get("lithi/trigger") or "manual"
    return {"lithi/trigger": trigger, "lithi/first_trigger": first}


def _relabel(context: dg.HookContext) -> None:
    run = context.instance.get_run_by_id(context.run_id)
    if run is None:
        return
    new = relabelled(run.tags)
    if new:
        context.instance.add_run_tags(run.run_id, new)


@dg.success_hook(name="lithi_label_reexecution_on_success")
def label_after_success(context: dg.HookContext) -> None:
    """Relabel a re-executed run once a step of it succeeded."""
    _relabel(context)


@dg.failure_hook(name="lithi_label_reexecution_on_failure")
def label_after_failure(context: dg.HookContext) -> None:
    """Relabel a re-executed run once a step of it failed."""
    _relabel(context)


RUN_LABEL_HOOKS = {label_after_success, label_after_failure}
