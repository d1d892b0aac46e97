"""``lithi-bundle verify PATH|URL [--json]``: every rule of the contract, every violation listed.

A URL (``s3://bucket/prefix/v1``) is downloaded into a cache first (:mod:`pipeline.cli.remote`).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from pipeline.bundle.verify import CheckResult, check
from pipeline.cli import remote
from pipeline.cli.output import EXIT_INVALID, EXIT_OK, EXIT_USAGE, UsageError, progress_bar, say


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Declare the subcommand and its flags."""
    what = "check every rule of the bundle contract"
    json_help = "print one JSON object for machines"
    remote.add_parser(sub, "verify", what, json_help=json_help, run=run, cache=True)


def run(args: argparse.Namespace) -> int:
    """Check the bundle; 0 valid, 1 invalid (every violation listed), 2 no such path."""
    if remote.is_remote(args.path):
        with remote.fetched(args.path, args.cache_dir, args.credential_env) as (store, got):
            return _print(args, args.path, check(got.path, trusted=store.trusted))
    root = Path(args.path)
    if not os.path.lexists(root):
        if args.json:  # a script asked for JSON: it gets JSON, whatever happened
            print(json.dumps(_usage_report(root, f"{root}: no such directory"), indent=2))
            return EXIT_USAGE
        raise UsageError(f"{root}: no such directory")
    with progress_bar("verify", unit="B", scale=True) as bar:
        result = check(root, progress=bar.bytes if bar else None)
    return _print(args, root, result)


def _print(args: argparse.Namespace, root: Path | str, result: CheckResult) -> int:
    if args.json:
        report = _report(result)
        if isinstance(root, str):  # a URL: "path" is the view it was downloaded to
            report["url"] = root
        print(json.dumps(report, indent=2))
    elif not result.ok:
        say(f"INVALID {root}: {len(result.errors)} violation(s)")
        for e in result.errors:
            say(f"  - {type(e).__name__}: {e}")
    else:
        snap = result.verified()
        m = snap.manifest
        say(f"VALID {root}")
        say(f"  version_id      {m.snapshot.version_id}")
        say(f"  content_sha256  {m.snapshot.content_sha256}")
        say(
            f"  {m.kind}, {m.counts.items} items in {len(m.parts)} part(s), "
            f"{snap.stats.bytes_total} bytes ({snap.stats.bytes_hashed} hashed)"
        )
    return EXIT_OK if result.ok else EXIT_INVALID


def _report(result: CheckResult) -> dict[str, Any]:
    m = result.manifest
    return {
        "path": str(result.root),
        "valid": result.ok,
        "snapshot": m.snapshot.model_dump() if m else None,
        "kind": m.kind if m else None,
        "errors": [
            {"type": type(e).__name__, "path": e.path, "message": str(e)} for e in result.errors
        ],
        "stats": vars(result.stats) if result.stats else None,
    }


def _usage_report(root: Path, message: str) -> dict[str, Any]:
    return {
        "path": str(root),
        "valid": False,
        "snapshot": None,
        "kind": None,
        "errors": [{"type": "UsageError", "path": str(root), "message": message}],
        "stats": None,
    }
