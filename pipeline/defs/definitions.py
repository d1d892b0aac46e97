"""The one ``Definitions`` that ``workspace.yaml`` loads: assets, checks, jobs, schedule, sensor.

Resources come with embedded defaults (local Compute, a bundle cache and artifacts under
``LITHI_HOME``) that environment variables override; see the README's configuration table.
"""

import os

import dagster as dg

from assets import CHAIN_ASSETS
from pipeline.defs.jobs import chain_job, resubmit_job
from pipeline.defs.sensor import compute_partial_sensor
from resources.dagster_resources import default_resources
from resources.settings import ChainSettings

chain_schedule = dg.ScheduleDefinition(
    name="compute_chain_schedule",
    job=chain_job,
    cron_schedule=os.environ.get("LITHI_CHAIN_CRON", "0 3 * * *"),
    execution_timezone="UTC",
    description="Rebuild the chain from the configured job's latest complete result manifest.",
)


def build_definitions(**resource_overrides: object) -> dg.Definitions:
    """Assemble the code location; tests pass resources that point at a temporary root."""
    resources = {
        **default_resources(),
        "chain_settings": ChainSettings.from_env(),
        "pipes_subprocess_client": dg.PipesSubprocessClient(),
        **resource_overrides,
    }
    return dg.Definitions(
        assets=CHAIN_ASSETS,
        jobs=[chain_job, resubmit_job],
        schedules=[chain_schedule],
        sensors=[compute_partial_sensor],
        resources=resources,
    )


defs = build_definitions()
