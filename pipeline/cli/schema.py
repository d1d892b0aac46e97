"""``lithi-bundle schema PATH [--check]``: the manifest's JSON Schema, generated from the model.

A tool for this repository's developers, where the schema is checked in as
``docs/result-manifest.schema.json``: the path is always given, so an installed package never
writes into its own files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.bundle.atomic import atomic_write_text
from pipeline.bundle.manifest import json_schema_text
from pipeline.cli.output import EXIT_INVALID, EXIT_OK


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Declare the subcommand and its flags."""
    sc = sub.add_parser(
        "schema",
        help="write the manifest JSON Schema to PATH (or --check that PATH is current)",
        description="Write the JSON Schema of manifest v1, generated from the model, to PATH, "
        "or with --check exit 1 if PATH is out of date. In this repository PATH is "
        "docs/result-manifest.schema.json.",
    )
    sc.add_argument("path", type=Path, metavar="PATH", help="the schema file")
    sc.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    sc.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the schema where it differs, or (``--check``) say whether it does."""
    text = json_schema_text()
    path: Path = args.path
    current = path.read_text() if path.exists() else ""
    if args.check:
        if current != text:
            print(f"{path} is out of date: run lithi-bundle schema {path}", file=sys.stderr)
            return EXIT_INVALID
        return EXIT_OK
    if current != text:
        atomic_write_text(path, text)
    print(f"{path}: {'written' if current != text else 'up to date'}")
    return EXIT_OK
