"""A fresh PostgreSQL database per test, on the server ``LITHI_TEST_POSTGRES_URL`` names.

Default ``postgresql://postgres@127.0.0.1:5432/test``. Where no server answers, the tests that
need one are skipped with the reason spelled out (``-rs`` prints it in the summary): the
Postgres-backed instance was then not tested, and the summary says so.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from resources.settings import REPO_ROOT

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEPLOY_YAML = REPO_ROOT / "deploy" / "dagster.yaml"


def server_url() -> str:
    """The server the Postgres tests use."""
    return os.environ.get("LITHI_TEST_POSTGRES_URL", DEFAULT_URL)


@contextmanager
def fresh_database() -> Iterator[str]:
    """Create an empty database, yield its URL, drop it afterwards (skip if no server)."""
    import psycopg2

    url = server_url()
    try:
        admin = psycopg2.connect(url, connect_timeout=5)
    except psycopg2.OperationalError as e:
        pytest.skip(
            f"POSTGRES-BACKED INSTANCE NOT TESTED: no PostgreSQL server at {url} "
            f"({str(e).strip().splitlines()[0]}); set LITHI_TEST_POSTGRES_URL"
        )
    admin.autocommit = True
    name = f"lithi_test_{secrets.token_hex(6)}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(url)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


def dagster_url(url: str) -> str:
    """``url`` with the psycopg2 driver named: SQLAlchemy 2.1 reads a bare ``postgresql://``
    as psycopg 3, and dagster-postgres ships psycopg2."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+')[0]}+psycopg2{sep}{rest}"


def postgres_home(path: Path, url: str) -> dict[str, str]:
    """A DAGSTER_HOME at ``path`` with the deploy/ Postgres yaml; the env that opens it."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DEPLOY_YAML, path / "dagster.yaml")
    return {"DAGSTER_HOME": str(path), "DAGSTER_POSTGRES_URL": dagster_url(url)}
