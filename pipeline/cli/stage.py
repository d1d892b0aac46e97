"""``lithi-bundle stage TABLE ...``: stream a table, batch by batch, into a new bundle."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import BundleError, BundleExists, one_line
from pipeline.bundle.manifest import InputRef, JobInfo, LineageHints, ResultStatus, check_lineage
from pipeline.bundle.sources import FORMATS, SUFFIXES, SourceError, open_source, read_schema_file
from pipeline.bundle.stage import DEFAULT_ROWS_PER_PART, stage
from pipeline.bundle.verify import verify
from pipeline.cli.output import EXIT_OK, IOFailure, UsageError, is_file, progress_bar, say

#: How a user of the command line fixes each lineage problem.
_HINTS = LineageHints(
    drop_input="drop the --input-* flags",
    name_input="--input-bundle DIR, or both --input-version-id and --input-sha256",
    describe_job="it needs --job-id",
    drop_job="--job-* and --outstanding are only for kind result",
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Declare the subcommand and its flags."""
    s = sub.add_parser(
        "stage",
        help="stage a table (Parquet, Arrow IPC/Feather, CSV, JSON Lines) as a new bundle",
        description="Stream TABLE batch by batch into a new bundle at --out. The format comes "
        f"from the suffix ({', '.join(SUFFIXES)}) or --format. CSV and JSON Lines carry no "
        "types: --schema FILE.json declares them. Result and prediction bundles must name the "
        "input snapshot they derive from; result bundles also describe their job and need the "
        "lithi_* columns.",
    )
    s.add_argument("table", type=Path, metavar="TABLE")
    s.add_argument("--id-field", required=True, help="the item id column (string, non-null)")
    s.add_argument("--kind", required=True, choices=("input", "result", "prediction"))
    s.add_argument("--out", required=True, type=Path, help="new bundle directory (must not exist)")
    s.add_argument("--format", choices=FORMATS, help="how to read TABLE (default: its suffix)")
    s.add_argument(
        "--schema",
        type=Path,
        metavar="FILE.json",
        help='declared column types, {"fields": [{"name", "type", "nullable"}, ...]} (the '
        "manifest's schema object); needed for CSV and JSON Lines, a safe cast otherwise",
    )
    s.add_argument("--rows-per-part", type=int, default=DEFAULT_ROWS_PER_PART)
    s.add_argument("--version-id", help="version id to record (default: generated, unique)")
    s.add_argument("--json", action="store_true", help="print the identity as JSON")
    g = s.add_argument_group("input snapshot (kind result or prediction)")
    g.add_argument("--input-bundle", type=Path, help="verify this bundle and derive from it")
    g.add_argument("--input-version-id", help="input version_id (with --input-sha256)")
    g.add_argument("--input-sha256", help="input content_sha256 (with --input-version-id)")
    g.add_argument("--credential-ref", help="registered credential reference (never a secret)")
    j = s.add_argument_group("job (kind result)")
    j.add_argument("--job-id")
    j.add_argument("--attempt", type=int, default=1)
    j.add_argument("--parent-version-id")
    j.add_argument(
        "--job-status",
        choices=("SUCCEEDED", "FAILED"),
        default="SUCCEEDED",
        help="status when nothing is outstanding; --outstanding makes it PARTIAL",
    )
    j.add_argument(
        "--outstanding",
        type=Path,
        metavar="IDS.parquet",
        help="Parquet file whose id column lists items without a result (makes it PARTIAL)",
    )
    s.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check every flag, then stage; 0 staged, 1 a write failed, 2 not as asked."""
    table: Path = args.table
    if not is_file(table):
        raise UsageError(f"{table}: no such file")
    if args.rows_per_part < 1:
        raise UsageError(f"--rows-per-part must be >= 1, got {args.rows_per_part}")
    _check_out(args.out)
    if args.version_id is not None:
        try:
            fmt.check_version_id(args.version_id, what="--version-id")
        except ValueError as e:
            raise UsageError(str(e)) from None
    _check_lineage(args)
    input_ref = _input_ref(args)
    job, outstanding = _job(args)
    try:
        declared = read_schema_file(args.schema) if args.schema is not None else None
        source = open_source(table, format=args.format, declared=declared)
    except SourceError as e:
        raise UsageError(str(e)) from None
    if args.id_field not in source.schema.names:
        raise UsageError(
            f"{table}: no column {args.id_field!r} (columns: {', '.join(source.schema.names)})"
        )
    with progress_bar("stage", unit="rows", total=source.num_rows) as bar:
        try:
            snap = stage(
                source.batches(),  # streams: one batch in memory
                args.out,
                id_field=args.id_field,
                kind=args.kind,
                schema=source.schema,
                rows_per_part=args.rows_per_part,
                job=job,
                input=input_ref,
                outstanding_ids=outstanding,
                version_id=args.version_id,
                on_rows=bar.rows if bar else None,
                source=str(table),
            )
        except BundleExists as e:  # appeared while staging: the name is taken
            raise UsageError(str(e)) from None
        except BundleError as e:  # the rows break the contract: not this table, as asked
            raise UsageError(f"{type(e).__name__}: {e}") from None
        except (ValueError, TypeError) as e:  # not a BundleError: the table does not fit v1
            raise UsageError(" ".join(str(e).split())) from None
        except OSError as e:  # nothing is left behind: stage() removed what it wrote
            raise IOFailure(f"cannot stage {args.out}: {_os_error(e)}; nothing was kept") from None
    ident = snap.identity
    if args.json:
        print(json.dumps({"path": str(args.out), "snapshot": ident.model_dump()}, indent=2))
    else:
        m = snap.manifest
        say(f"staged {args.out}: {m.counts.items} items in {len(m.parts)} part(s)")
        say(f"  version_id      {ident.version_id}")
        say(f"  content_sha256  {ident.content_sha256}")
    return EXIT_OK


def _os_error(e: OSError) -> str:
    """An OSError on one line: what failed, and where when it says."""
    what = e.strerror or " ".join(str(e).split()) or type(e).__name__
    return f"{what} ({e.filename})" if e.filename else what


def _check_out(out: Path) -> None:
    """``--out`` must be a new name whose nearest existing ancestor is a directory."""
    if os.path.lexists(out):
        kind = "a dangling symlink" if out.is_symlink() and not out.exists() else "something"
        raise UsageError(f"--out {out}: {kind} already exists there; a bundle is never overwritten")
    d = out.parent
    while not os.path.lexists(d):
        d = d.parent
    if not d.is_dir():
        raise UsageError(f"--out {out}: {d} is not a directory")


def _check_lineage(args: argparse.Namespace) -> None:
    """The lineage rule over the flags given, before anything is read or verified."""
    input_flags = (args.input_bundle, args.input_version_id, args.input_sha256, args.credential_ref)
    job_flags = (args.job_id, args.parent_version_id, args.outstanding)
    has_job = any(job_flags) or args.attempt != 1 or args.job_status != "SUCCEEDED"
    try:
        check_lineage(args.kind, has_input=any(input_flags), has_job=has_job, hints=_HINTS)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _input_ref(args: argparse.Namespace) -> InputRef | None:
    """The input snapshot the flags name (``--input-bundle`` is verified first)."""
    if args.kind == "input":
        return None
    if args.input_bundle:
        if args.input_version_id or args.input_sha256:
            raise UsageError("give --input-bundle or --input-version-id/--input-sha256, not both")
        if not args.input_bundle.is_dir():
            raise UsageError(f"--input-bundle {args.input_bundle}: no such directory")
        ident = verify(args.input_bundle).identity  # derive only from something verified
        vid, sha = ident.version_id, ident.content_sha256
    elif args.input_version_id and args.input_sha256:
        vid, sha = args.input_version_id, args.input_sha256
    else:
        raise UsageError(f"a {args.kind} bundle must name its input snapshot: {_HINTS.name_input}")
    try:
        return InputRef(version_id=vid, content_sha256=sha, credential_ref=args.credential_ref)
    except ValidationError as e:
        raise UsageError(f"bad input snapshot: {one_line(e)}") from None


def _job(args: argparse.Namespace) -> tuple[JobInfo | None, pa.Array | None]:
    """The job the flags describe, and the outstanding ids (which make it PARTIAL)."""
    if args.kind != "result":
        return None, None
    if not args.job_id:
        raise UsageError(f"a result bundle must describe its job: {_HINTS.describe_job}")
    outstanding = _outstanding_ids(args.outstanding, args.id_field) if args.outstanding else None
    partial = outstanding is not None and len(outstanding) > 0
    status: ResultStatus = "PARTIAL" if partial else args.job_status
    try:
        job = JobInfo(
            job_id=args.job_id,
            status=status,
            attempt=args.attempt,
            parent_version_id=args.parent_version_id,
        )
    except ValidationError as e:
        raise UsageError(f"bad job description: {one_line(e)}") from None
    return job, outstanding


def _outstanding_ids(path: Path, id_field: str) -> pa.Array:
    """The ids listed in an ``--outstanding`` Parquet file (its ``id_field`` column, strings)."""
    if not is_file(path):
        raise UsageError(f"--outstanding {path}: no such file")
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        if id_field not in names:
            raise UsageError(
                f"--outstanding {path}: no id column {id_field!r} (columns: {', '.join(names)})"
            )
        ids = pf.read(columns=[id_field]).column(id_field).combine_chunks()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise UsageError(
            f"--outstanding {path}: not a readable Parquet file listing the outstanding ids: "
            f"{' '.join(str(e).split())}"
        ) from None
    if pa.types.is_dictionary(ids.type):
        ids = ids.dictionary_decode()
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
        raise UsageError(
            f"--outstanding {path}: id column {id_field!r} must hold strings, found {ids.type}"
        )
    return ids
