"""One exception family for every way a bundle can be wrong.

Each error names the file (or field) and what was expected versus what was found, so a
message read in a log or a Dagster run page is enough to act on without a stack trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic is only needed by whoever holds a ValidationError
    from pydantic import ValidationError
    from pydantic_core import ErrorDetails


class BundleError(Exception):
    """Base of every bundle contract violation."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class IncompleteBundle(BundleError):
    """The bundle has no ``result-manifest.json``: it is not finished, whatever files it has."""


class ManifestInvalid(BundleError):
    """``result-manifest.json`` is not JSON, or does not satisfy the v1 model."""


class UnsafePath(BundleError):
    """A bound path is absolute, escapes the bundle, or is a symlink or not a regular file."""


class MissingFile(BundleError):
    """A file the manifest binds is not in the bundle."""


class UnreadableFile(BundleError):
    """A bound file or a directory of the bundle exists but cannot be read (permission, I/O)."""


class UnboundFile(BundleError):
    """A file is in the bundle directory but the manifest does not bind it."""


class SizeMismatch(BundleError):
    """A bound file's byte size differs from the manifest's ``bytes``."""


class DigestMismatch(BundleError):
    """A file's sha256, or the bundle's ``content_sha256``, differs from the manifest."""


class RowCountMismatch(BundleError):
    """A Parquet file's row count differs from the manifest's ``rows``."""


class SchemaMismatch(BundleError):
    """A part's Parquet schema differs from the declared schema (name, order, type, nullability)."""


class IdentifierError(BundleError):
    """An item id is null, not a string, or appears more than once in the bundle."""


class DuplicateIds(IdentifierError):
    """Some ids appear more than once across the parts and the outstanding list."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        count: int = 0,
        examples: list[str] | None = None,
    ) -> None:
        super().__init__(message, path=path)
        self.count = count
        self.examples = list(examples or [])


class CountMismatch(BundleError):
    """The manifest's counts disagree with the rows, or with each other."""


class StatusMismatch(BundleError):
    """The job status disagrees with the outstanding list (PARTIAL exactly when items are left)."""


class BundleExists(BundleError):
    """Staging refused: a bundle already exists under that name and is never overwritten."""


class NotVerified(BundleError):
    """A reader was given something other than a verified snapshot (a path, a raw manifest)."""


def problem(err: ErrorDetails) -> str:
    """One pydantic error's message, without the ``Value error, `` put before a validator's own."""
    return err["msg"].removeprefix("Value error, ")


def location(err: ErrorDetails, root: str = "<root>") -> str:
    """Where one pydantic error is, dotted (``schema.fields.0.type``), or ``root`` for the whole."""
    return ".".join(str(x) for x in err["loc"]) or root


def one_line(
    e: ValidationError,
    *,
    root: str = "<root>",
    locations: bool = True,
    each: Callable[[ErrorDetails], str] | None = None,
) -> str:
    """Every problem a ``ValidationError`` found, on one line: ``where: what``, ``; `` between.

    The one way a rejected model becomes a message (a manifest, a schema file, a trainer's config,
    the environment, a command line). ``root`` names the whole object when the problem is not in
    one field; without ``locations`` only the messages are joined; ``each`` words one problem
    itself, for a caller whose fields have other names outside (environment variables).
    """

    def default(err: ErrorDetails) -> str:
        return f"{location(err, root)}: {problem(err)}" if locations else problem(err)

    return "; ".join((each or default)(err) for err in e.errors())
