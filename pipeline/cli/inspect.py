"""``lithi-bundle inspect PATH|URL [--json]``: identity, counts, schema and files, from the
manifest alone (nothing is hashed; ``verify`` checks the files), once the bundle passes
``verify``'s path and file-type rules (no symlink, no FIFO). For a URL (``s3://...``) only the
manifest is read, remotely (:mod:`pipeline.cli.remote`)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from pipeline.bundle.files import unsafe_paths
from pipeline.bundle.verify import read_manifest
from pipeline.cli import remote
from pipeline.cli.output import EXIT_OK, UsageError, say, table


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Declare the subcommand and its flags."""
    what = "show identity, counts, schema and parts (no hashing)"
    remote.add_parser(sub, "inspect", what, json_help="print the manifest as JSON", run=run)


def run(args: argparse.Namespace) -> int:
    """Print the manifest; an invalid one is a :class:`~pipeline.bundle.errors.BundleError`."""
    root: Path | str
    if remote.is_remote(args.path):
        url: str = args.path
        m = remote.manifest(url, args.credential_env)  # BundleError -> exit 1
        root = url
    else:
        root = Path(args.path)
        if not os.path.lexists(root):
            raise UsageError(f"{root}: no such directory")
        m = read_manifest(root)  # BundleError -> exit 1
        unsafe = unsafe_paths(root, m)
        if unsafe:  # what verify refuses is never shown as a bundle
            raise unsafe[0]
    if args.json:  # ASCII JSON: safe on any terminal, parsed back to the same manifest
        print(json.dumps(m.model_dump(mode="json", by_alias=True), indent=2))
        return EXIT_OK
    say(f"bundle          {root}  (manifest only; run `lithi-bundle verify` to check files)")
    say(f"kind            {m.kind}")
    say(f"version_id      {m.snapshot.version_id}")
    say(f"content_sha256  {m.snapshot.content_sha256}")
    say(f"created_at      {m.model_dump(mode='json')['created_at']}")
    say(f"item_id_field   {m.item_id_field}")
    if m.input is not None:
        say(f"input           {m.input.version_id}  {m.input.content_sha256}")
        if m.input.credential_ref:
            say(f"credential_ref  {m.input.credential_ref}")
    if m.job is not None:
        j = m.job
        say(f"job             {j.job_id}  {j.status}  attempt {j.attempt}")
        if j.parent_version_id:
            say(f"parent_version  {j.parent_version_id}")
        if j.next_action:
            say(f"next_action     {j.next_action.action} ({j.next_action.items} items)")
    counts = {k: v for k, v in m.counts.model_dump().items() if v is not None}
    say("counts          " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    say()
    say("schema")
    table(
        ["#", "name", "type", "nullable"],
        [
            [
                str(n),
                f.name + (" (id)" if f.name == m.item_id_field else ""),
                f.type,
                str(f.nullable),
            ]
            for n, f in enumerate(m.schema_.fields)
        ],
    )
    say()
    say("files")
    table(
        ["path", "rows", "bytes", "sha256"],
        [[f.path, str(f.rows), str(f.bytes), f.sha256] for f in m.bound_files],
        right={1, 2},
    )
    return EXIT_OK
