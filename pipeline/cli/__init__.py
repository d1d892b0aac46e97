"""``lithi-bundle``: verify, inspect and stage bundles from a shell, with no Dagster involved.

Exit codes are a contract for scripts: 0 the bundle is valid (or the command succeeded), 1 the
bundle is invalid (every violation is listed) or the command failed on I/O (a full or read-only
disk; nothing is left behind), 2 the command was used wrongly (bad flags, a path that does not
exist, a table that cannot be staged as asked). Every failure is one line on stderr.

Everything printed that comes from a bundle (ids, names, paths, messages quoting them) is
untrusted: text lines escape every non-printable character (``\\n``, ``\\x1b``, ``\\u202e``,
``\\udcff`` for a byte that is not UTF-8), so a crafted bundle cannot forge a line or drive the
terminal; JSON output is ASCII.

One module per subcommand (:mod:`~pipeline.cli.verify`, :mod:`~pipeline.cli.inspect`,
:mod:`~pipeline.cli.stage`, :mod:`~pipeline.cli.schema`); what they share is in
:mod:`~pipeline.cli.output`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from pipeline.bundle.errors import BundleError
from pipeline.cli import inspect, schema, stage, verify
from pipeline.cli.output import EXIT_INVALID, EXIT_USAGE, IOFailure, Parser, UsageError, say

__all__ = ["main"]


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
        code: int = args.run(args)
        return code
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


def _parser() -> Parser:
    ap = Parser(
        prog="lithi-bundle",
        description="Verify, inspect and stage immutable Lithi bundles (format v1).",
        epilog="Exit codes: 0 valid/ok, 1 invalid bundle, 2 usage error.",
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (verify, inspect, stage, schema):
        command.add_parser(sub)
    return ap
