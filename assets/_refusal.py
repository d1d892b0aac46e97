"""A failure the same inputs would only repeat (a config the trainer refuses, say): the run says
so, and neither the op's retry policy nor the daemon's run retries try it again."""

from __future__ import annotations

import dagster as dg

from assets import _metadata as md

#: The run tag Dagster's run retries read: ``false`` retries no run that failed in a step.
RETRY_ON_STEP_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"


def refusal(context: dg.AssetExecutionContext, message: str) -> dg.Failure:
    """The failure to raise for ``message``, after marking the run as not to be retried."""
    md.tag_run(context, {RETRY_ON_STEP_FAILURE_TAG: "false"})
    return dg.Failure(message, allow_retries=False)
