"""The few private Dagster names the tests need, in one place so an upgrade touches one file.

The run tags the daemon stamps on sensor runs and dedupes by (``dagster/_daemon/sensor.py``), and
the in-process workspace used to run GraphQL queries the way the webserver does, and the kind
of instigator whose ticks a test counts; a job's snapshot as the instance stores it;
``observe``, what the UI's *Observe* button runs.
"""

from dagster._core.definitions.observe import observe
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.scheduler.instigation import InstigatorType
from dagster._core.snap.job_snapshot import JobSnap
from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

__all__ = [
    "RUN_KEY_TAG",
    "SENSOR_NAME_TAG",
    "InProcessCodeLocationOrigin",
    "InProcessWorkspaceLoadTarget",
    "InstigatorType",
    "JobSnap",
    "LoadableTargetOrigin",
    "WorkspaceProcessContext",
    "observe",
]
