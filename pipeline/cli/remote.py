"""Bundles at URLs for ``verify`` and ``inspect``: ``s3://bucket/prefix/v1`` and the like.

``verify URL`` downloads the bundle into a cache (``--cache-dir``; else a temporary one, removed
afterwards) with every guarantee of :meth:`resources.bundle_store.BundleStore.fetch` (the manifest
read first and last, each file's size and sha256 checked as it arrives, a part that does not match
refused by name), then checks every rule on the local view, trusting only what the cache hashed.
``inspect URL`` reads the manifest alone, remotely: nothing else is downloaded. The secret comes
from the environment variable ``--credential-env`` names (``<access_key_id>:<secret>`` for
``s3://``), never from the command line; an S3-compatible store's endpoint from
``AWS_ENDPOINT_URL_S3``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.bundle.manifest import Manifest
from pipeline.cli.output import IOFailure, UsageError
from resources.bundle_store import BundleStore, FetchResult, is_remote
from resources.credentials import CredentialError, CredentialRegistry

#: The name the command line's one credential is registered under.
_REF = "cli"

__all__ = ["add_parser", "fetched", "is_remote", "manifest"]


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    *,
    json_help: str,
    run: Callable[[argparse.Namespace], int],
    cache: bool = False,
) -> argparse.ArgumentParser:
    """Declare a subcommand over one bundle, a directory or a URL: its ``PATH|URL``, ``--json``
    and the flags for URLs (``--credential-env``; with ``cache``, ``--cache-dir``)."""
    p = sub.add_parser(name, help=help)
    p.set_defaults(run=run)
    p.add_argument("path", metavar="PATH|URL", help="bundle directory, or its URL (s3://...)")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument(
        "--credential-env",
        metavar="VAR",
        help="for a URL: the environment variable holding the secret (for s3:// "
        "'<access_key_id>:<secret_access_key>'); unset: the store's default credentials",
    )
    if cache:
        p.add_argument(
            "--cache-dir",
            type=Path,
            metavar="DIR",
            help="for a URL: the bundle cache to download into (default: a temporary one)",
        )
    return p


def _store(cache: Path, credential_env: str | None) -> tuple[BundleStore, str | None]:
    if credential_env is None:
        return BundleStore(cache), None
    if not os.environ.get(credential_env):
        raise UsageError(f"--credential-env {credential_env}: that variable is not set")
    try:
        return BundleStore(cache, CredentialRegistry({_REF: credential_env})), _REF
    except ValueError as e:
        raise UsageError(f"--credential-env {credential_env!r}: {e}") from None


@contextlib.contextmanager
def fetched(
    url: str, cache_dir: Path | None, credential_env: str | None
) -> Iterator[tuple[BundleStore, FetchResult]]:
    """Download the bundle at ``url`` into the cache; yield the store and the fetch."""
    with contextlib.ExitStack() as stack:
        if cache_dir is None:
            cache_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lithi-")))
        store, ref = _store(cache_dir, credential_env)
        try:
            result = store.fetch(url, credential_ref=ref)
        except (OSError, ValueError, CredentialError) as e:  # unreachable, denied, unknown
            raise IOFailure(f"{url}: cannot be read ({type(e).__name__}: {e})") from None
        yield store, result


def manifest(url: str, credential_env: str | None) -> Manifest:
    """Read and validate the manifest at ``url`` alone."""
    with tempfile.TemporaryDirectory(prefix="lithi-") as cache:
        store, ref = _store(Path(cache), credential_env)
        try:
            return store.read_manifest(url, ref)
        except (OSError, ValueError, CredentialError) as e:
            raise IOFailure(f"{url}: cannot be read ({type(e).__name__}: {e})") from None
