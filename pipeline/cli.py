"""``lithi-bundle``: verify, inspect and stage bundles from a shell, with no Dagster involved.

Exit codes are a contract for scripts: 0 the bundle is valid (or the command succeeded), 1 the
bundle is invalid (every violation is listed) or the command failed on I/O (a full or read-only
disk; nothing is left behind), 2 the command was used wrongly (bad flags, a path that does not
exist, a table that cannot be staged as asked). Every failure is one line on stderr.

Everything printed that comes from a bundle (ids, names, paths, messages quoting them) is
untrusted: text lines escape every non-printable character (``\\n``, ``\\x1b``, ``\\u202e``,
``\\udcff`` for a byte that is not UTF-8), so a crafted bundle cannot forge a line or drive the
terminal; JSON output is ASCII.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import atomic_write_text
from pipeline.bundle.errors import BundleError, BundleExists
from pipeline.bundle.manifest import InputRef, JobInfo, Manifest, json_schema_text
from pipeline.bundle.sources import FORMATS, SUFFIXES, SourceError, open_source, read_schema_file
from pipeline.bundle.stage import DEFAULT_ROWS_PER_PART, stage
from pipeline.bundle.verify import VerifyStats, check, read_manifest, verify

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """The command line asks for something impossible; exit code 2, no stack trace."""


class IOFailure(Exception):
    """Writing failed (no space, a read-only file system, a permission); exit code 1."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (and exit 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        say(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def escape(text: object) -> str:
    """``text`` fit for one line of a terminal or a log: each non-printable character escaped.

    Bundle contents are untrusted; a newline or an ANSI sequence in an id or a file name would
    otherwise let a crafted bundle print a fake ``VALID`` line or rewrite the screen.
    """
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def say(text: object = "", *, file: TextIO | None = None) -> None:
    """Print one line of untrusted text, escaped (see :func:`escape`)."""
    print(escape(text), file=file or sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lithi-bundle`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    for stream in (sys.stdout, sys.stderr):
        # A terminal that cannot show a character gets its escape, never a UnicodeEncodeError.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage, 0 on --help
        return int(e.code or 0)
    try:
        return args.run(args)
    except UsageError as e:
        say(f"lithi-bundle {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BundleError as e:
        say(f"lithi-bundle {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_INVALID
    except IOFailure as e:
        say(f"lithi-bundle {args.command}: {e}", file=sys.stderr)
        return EXIT_INVALID
    except BrokenPipeError:  # e.g. `lithi-bundle inspect B | head`: the reader stopped
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail
        return EXIT_INVALID


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="lithi-bundle",
        description="Verify, inspect and stage immutable Lithi bundles (format v1).",
        epilog="Exit codes: 0 valid/ok, 1 invalid bundle, 2 usage error.",
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("verify", help="check every rule of the bundle contract")
    v.add_argument("path", type=Path, metavar="PATH", help="bundle directory")
    v.add_argument("--json", action="store_true", help="print one JSON object for machines")
    v.set_defaults(run=_cmd_verify)

    i = sub.add_parser("inspect", help="show identity, counts, schema and parts (no hashing)")
    i.add_argument("path", type=Path, metavar="PATH", help="bundle directory")
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
    i.set_defaults(run=_cmd_inspect)

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
    s.set_defaults(run=_cmd_stage)

    sc = sub.add_parser(
        "schema",
        help="write the manifest JSON Schema (docs/result-manifest.schema.json)",
        description="Regenerate the checked-in JSON Schema from the manifest model, or with "
        "--check exit 1 if the file is out of date.",
    )
    sc.add_argument("path", nargs="?", type=Path, default=_repo_root() / SCHEMA_DOC)
    sc.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    sc.set_defaults(run=_cmd_schema)
    return ap


# --- verify ---------------------------------------------------------------------------------


def _cmd_verify(args: argparse.Namespace) -> int:
    root: Path = args.path
    if not os.path.lexists(root):
        if args.json:  # a script asked for JSON: it gets JSON, whatever happened
            print(json.dumps(_usage_report(root, f"{root}: no such directory"), indent=2))
            return EXIT_USAGE
        raise UsageError(f"{root}: no such directory")
    with _progress_bar("verify", unit="B", scale=True) as bar:
        manifest, errors, stats = check(root, progress=bar.bytes if bar else None)
    if args.json:
        print(json.dumps(_verify_report(root, manifest, errors, stats), indent=2))
    elif errors:
        say(f"INVALID {root}: {len(errors)} violation(s)")
        for e in errors:
            say(f"  - {type(e).__name__}: {e}")
    else:
        assert manifest is not None and stats is not None
        snap = manifest.snapshot
        say(f"VALID {root}")
        say(f"  version_id      {snap.version_id}")
        say(f"  content_sha256  {snap.content_sha256}")
        say(
            f"  {manifest.kind}, {manifest.counts.items} items in {len(manifest.parts)} part(s), "
            f"{stats.bytes_total} bytes ({stats.bytes_hashed} hashed)"
        )
    return EXIT_INVALID if errors else EXIT_OK


def _verify_report(
    root: Path, manifest: Manifest | None, errors: list[BundleError], stats: VerifyStats | None
) -> dict[str, Any]:
    return {
        "path": str(root),
        "valid": not errors,
        "snapshot": manifest.snapshot.model_dump() if manifest else None,
        "kind": manifest.kind if manifest else None,
        "errors": [{"type": type(e).__name__, "path": e.path, "message": str(e)} for e in errors],
        "stats": vars(stats) if stats else None,
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


# --- inspect --------------------------------------------------------------------------------


def _cmd_inspect(args: argparse.Namespace) -> int:
    root: Path = args.path
    if not os.path.lexists(root):
        raise UsageError(f"{root}: no such directory")
    m = read_manifest(root)  # BundleError -> exit 1
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
    _table(
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
    _table(
        ["path", "rows", "bytes", "sha256"],
        [[f.path, str(f.rows), str(f.bytes), f.sha256] for f in m.bound_files],
        right={1, 2},
    )
    return EXIT_OK


def _table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> None:
    """Print a plain aligned text table (no colours: it is read in logs and piped to grep).

    Cells are escaped before they are measured, so a crafted name cannot break the columns; a
    table with no rows (an empty bundle has no files) prints its headers alone.
    """
    right = right or set()
    rows = [[escape(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    say(line(headers))
    say("  ".join("-" * w for w in widths))
    for r in rows:
        say(line(r))
    if not rows:
        say("(none)")


# --- stage ----------------------------------------------------------------------------------


def _cmd_stage(args: argparse.Namespace) -> int:
    table: Path = args.table
    if not _is_file(table):
        raise UsageError(f"{table}: no such file")
    if args.rows_per_part < 1:
        raise UsageError(f"--rows-per-part must be >= 1, got {args.rows_per_part}")
    _check_out(args.out)
    if args.version_id is not None:
        try:
            fmt.check_version_id(args.version_id, what="--version-id")
        except ValueError as e:
            raise UsageError(str(e)) from None
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
    with _progress_bar("stage", unit="rows", total=source.num_rows) as bar:
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


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte
        return False


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


def _input_ref(args: argparse.Namespace) -> InputRef | None:
    given = args.input_bundle or args.input_version_id or args.input_sha256
    if args.kind == "input":
        if given or args.credential_ref:
            raise UsageError("an input bundle derives from nothing: drop the --input-* flags")
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
        raise UsageError(
            f"a {args.kind} bundle must name its input: --input-bundle DIR, or both "
            "--input-version-id and --input-sha256"
        )
    try:
        return InputRef(version_id=vid, content_sha256=sha, credential_ref=args.credential_ref)
    except ValueError as e:
        raise UsageError(f"bad input snapshot: {_problems(e)}") from None


def _problems(e: ValueError) -> str:
    """A pydantic ValidationError (or any ValueError) on one line."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        return "; ".join(
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in errors()
        )
    return " ".join(str(e).split())


def _job(args: argparse.Namespace) -> tuple[JobInfo | None, Any]:
    job_flags = args.job_id or args.parent_version_id or args.outstanding or args.attempt != 1
    if args.kind != "result":
        if job_flags or args.job_status != "SUCCEEDED":
            raise UsageError(f"--job-* and --outstanding are only for kind result, not {args.kind}")
        return None, None
    if not args.job_id:
        raise UsageError("a result bundle needs --job-id")
    outstanding = _outstanding_ids(args.outstanding, args.id_field) if args.outstanding else None
    status = "PARTIAL" if outstanding is not None and len(outstanding) else args.job_status
    try:
        job = JobInfo(
            job_id=args.job_id,
            status=status,
            attempt=args.attempt,
            parent_version_id=args.parent_version_id,
        )
    except ValueError as e:
        raise UsageError(f"bad job description: {_problems(e)}") from None
    return job, outstanding


def _outstanding_ids(path: Path, id_field: str) -> pa.Array:
    """The ids listed in an ``--outstanding`` Parquet file (its ``id_field`` column, strings)."""
    if not _is_file(path):
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


# --- schema ---------------------------------------------------------------------------------

#: Where the generated JSON Schema is checked in, relative to the repository root.
SCHEMA_DOC = "docs/result-manifest.schema.json"


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def _cmd_schema(args: argparse.Namespace) -> int:
    text = json_schema_text()
    path: Path = args.path
    current = path.read_text() if path.exists() else ""
    if args.check:
        if current != text:
            print(f"{path} is out of date: run lithi-bundle schema", file=sys.stderr)
            return EXIT_INVALID
        return EXIT_OK
    if current != text:
        atomic_write_text(path, text)
    print(f"{path}: {'written' if current != text else 'up to date'}")
    return EXIT_OK


# --- progress -------------------------------------------------------------------------------


class _Bar:
    """Adapts the library's progress callbacks (cumulative bytes, row deltas) to tqdm."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._lock = threading.Lock()  # byte progress arrives from hashing threads

    def bytes(self, done: int, total: int) -> None:
        with self._lock:
            if self._bar.total != total:
                self._bar.total = total
            self._bar.update(done - self._bar.n)

    def rows(self, n: int) -> None:
        self._bar.update(n)


@contextmanager
def _progress_bar(desc: str, *, stream: TextIO | None = None, **kw: Any) -> Iterator[_Bar | None]:
    """A tqdm bar on stderr when stderr is a terminal; ``None`` otherwise (logs stay clean)."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield None
        return
    from tqdm import tqdm

    unit_scale = kw.pop("scale", False)
    bar = tqdm(desc=desc, file=stream, unit_scale=unit_scale, unit_divisor=1024, leave=False, **kw)
    try:
        yield _Bar(bar)
    finally:
        bar.close()


if __name__ == "__main__":
    sys.exit(main())
