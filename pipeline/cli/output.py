"""What every ``lithi-bundle`` subcommand shares: exit codes, failures, escaped text, progress.

Everything printed that comes from a bundle (ids, names, paths, messages quoting them) is
untrusted: :func:`say` escapes every non-printable character, so a crafted bundle cannot forge a
line or drive the terminal.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TextIO

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """The command line asks for something impossible; exit code 2, no stack trace."""


class IOFailure(Exception):
    """Writing failed (no space, a read-only file system, a permission); exit code 1."""


class Parser(argparse.ArgumentParser):
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


def table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> None:
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


def is_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (a name too long or holding a NUL byte is not)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


class Bar:
    """Adapts the library's progress callbacks (cumulative bytes, row deltas) to tqdm."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._lock = threading.Lock()  # byte progress arrives from hashing threads

    def bytes(self, done: int, total: int) -> None:
        """Progress in bytes: ``done`` of ``total`` so far."""
        with self._lock:
            if self._bar.total != total:
                self._bar.total = total
            self._bar.update(done - self._bar.n)

    def rows(self, n: int) -> None:
        """Progress in rows: ``n`` more."""
        self._bar.update(n)


@contextmanager
def progress_bar(desc: str, *, stream: TextIO | None = None, **kw: Any) -> Iterator[Bar | None]:
    """A tqdm bar on stderr when stderr is a terminal; ``None`` otherwise (logs stay clean)."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield None
        return
    from tqdm import tqdm  # only a terminal needs it

    unit_scale = kw.pop("scale", False)
    bar = tqdm(desc=desc, file=stream, unit_scale=unit_scale, unit_divisor=1024, leave=False, **kw)
    try:
        yield Bar(bar)
    finally:
        bar.close()
