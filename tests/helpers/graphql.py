"""Dagster's GraphQL API in-process, over an instance: what the UI reads, without a browser.

The code location is loaded in-process (``pipeline.defs.definitions``) and queried with the
schema the webserver serves at ``/graphql`` (dagster-webserver's own tests do the same).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg
from dagster_graphql.test.utils import execute_dagster_graphql

from resources.settings import REPO_ROOT
from tests.helpers.dagster_internals import (
    InProcessCodeLocationOrigin,
    InProcessWorkspaceLoadTarget,
    LoadableTargetOrigin,
    WorkspaceProcessContext,
)

Query = Callable[..., dict[str, Any]]

STALENESS = """
{
  assetNodes {
    assetKey { path }
    staleStatus
    staleCauses { reason category key { path } }
  }
}
"""


@contextlib.contextmanager
def graphql_on(
    instance: dg.DagsterInstance, *, read_only: bool = True, env_now: bool = False
) -> Iterator[Query]:
    """A ``query(text, **variables) -> data`` function over ``instance`` (``read_only=False``:
    mutations too, as a webserver started without ``--read-only`` serves them; ``env_now``: the
    location built from the ``LITHI_*`` variables as they are now, as a code server would)."""
    module = "tests.helpers.location_from_env" if env_now else "pipeline.defs.definitions"
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name=module, working_directory=str(REPO_ROOT))
    )
    with WorkspaceProcessContext(
        instance,
        InProcessWorkspaceLoadTarget(origin),
        version=dg.__version__,
        read_only=read_only,
    ) as process_context:
        entries = process_context.create_request_context().get_code_location_entries()
        for name, entry in entries.items():
            assert entry.load_error is None, f"code location {name} failed to load: {entry}"

        def query(text: str, **variables: object) -> dict[str, Any]:
            result = execute_dagster_graphql(
                process_context.create_request_context(), text, variables
            )
            assert not result.errors, result.errors
            return result.data

        yield query


def stale_status(query: Query) -> dict[str, str]:
    """Every asset's stale status as the UI shows it (FRESH, STALE, MISSING)."""
    return {n["assetKey"]["path"][-1]: n["staleStatus"] for n in query(STALENESS)["assetNodes"]}


LAUNCH = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on PythonError { message }
  }
}
"""

LOCATION = """
{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }
"""


def repository(query: Query) -> dict[str, str]:
    """The code location's one repository, as a selector's first two fields."""
    (repo,) = query(LOCATION)["repositoriesOrError"]["nodes"]
    return {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"]}


def launch(
    query: Query, job: str, run_config: dict | None = None, tags: dict[str, str] | None = None
) -> dict[str, Any]:
    """What the Launchpad's *Launch run* sends: ``launchRun``'s answer."""
    params: dict[str, Any] = {"selector": {**repository(query), "jobName": job}}
    if run_config is not None:
        params["runConfigData"] = run_config
    if tags:
        params["executionMetadata"] = {"tags": [{"key": k, "value": v} for k, v in tags.items()]}
    return query(LAUNCH, params=params)["launchRun"]
