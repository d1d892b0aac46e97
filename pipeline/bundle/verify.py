"""Verify a bundle against its manifest and return a frozen, verified snapshot.

Nothing reads a bundle before this has passed. It checks, in order: the manifest exists and
validates; the directory holds exactly the bound files (no extras, no symlinks, nothing outside);
every file's size and sha256 (:mod:`pipeline.bundle.files`); every intact part's row count and
Parquet schema against the declared one, ids non-null and unique across parts and the
outstanding list, status counts (:mod:`pipeline.bundle.contents`); ``content_sha256``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.bundle import format as fmt
from pipeline.bundle.contents import check_contents, schema_difference
from pipeline.bundle.digest import content_sha256
from pipeline.bundle.errors import BundleError, DigestMismatch, NotVerified
from pipeline.bundle.files import (
    MAX_LISTED,
    ProgressFn,
    TrustFn,
    VerifyStats,
    hash_bound,
    read_manifest,
    stat_bound,
    unbound_files,
)
from pipeline.bundle.manifest import Manifest, SnapshotId

__all__ = [
    "MAX_LISTED",
    "CheckResult",
    "ProgressFn",
    "TrustFn",
    "VerifiedSnapshot",
    "VerifyStats",
    "check",
    "read_manifest",
    "require_verified",
    "schema_difference",
    "verify",
]


@dataclass(frozen=True)
class VerifiedSnapshot:
    """A bundle that passed :func:`verify`: its root, its manifest, and what checking it cost.

    Only this type is accepted by the index and the datasets, so no reader can be pointed at an
    unverified directory by accident.
    """

    root: Path
    manifest: Manifest
    stats: VerifyStats = field(compare=False)

    @property
    def identity(self) -> SnapshotId:
        """The ``snapshot`` identity to pin in an experiment record."""
        return self.manifest.snapshot

    def part_paths(self) -> list[Path]:
        """Absolute paths of the bound parts, in read order."""
        return [self.root / p.path for p in self.manifest.parts]


@dataclass(frozen=True)
class CheckResult:
    """Everything :func:`check` found in one bundle: valid exactly when ``errors`` is empty.

    ``manifest`` and ``stats`` are ``None`` only when the manifest itself is missing or invalid
    (then that is the one error); :meth:`verified` turns a valid result into a snapshot.
    """

    root: Path
    manifest: Manifest | None
    errors: list[BundleError]
    stats: VerifyStats | None

    @property
    def ok(self) -> bool:
        """Whether the bundle satisfies every rule."""
        return not self.errors

    def raise_first(self) -> None:
        """Raise the first violation, if there is one."""
        if self.errors:
            raise self.errors[0]

    def verified(self) -> VerifiedSnapshot:
        """The :class:`VerifiedSnapshot`, or the first violation raised."""
        self.raise_first()
        if self.manifest is None or self.stats is None:  # a missing manifest is an error above
            raise NotVerified(f"{self.root}: not checked", path=str(self.root))
        return VerifiedSnapshot(root=self.root.resolve(), manifest=self.manifest, stats=self.stats)


def require_verified(obj: object, what: str = "a reader") -> VerifiedSnapshot:
    """Return ``obj`` if it is a :class:`VerifiedSnapshot`, else raise :class:`NotVerified`."""
    if isinstance(obj, VerifiedSnapshot):
        return obj
    hint = " (a Manifest alone proves nothing about the files)" if isinstance(obj, Manifest) else ""
    raise NotVerified(
        f"{what} needs a VerifiedSnapshot returned by pipeline.bundle.verify(path); "
        f"found {type(obj).__name__} {obj!r:.80}{hint}. Call verify(path) first, so no "
        "unverified or unfinished bundle is ever read",
        path=str(obj) if isinstance(obj, (str, os.PathLike)) else None,
    )


def verify(
    path: str | os.PathLike[str],
    *,
    trusted: TrustFn | None = None,
    progress: ProgressFn | None = None,
) -> VerifiedSnapshot:
    """Verify the bundle at ``path``; raise the first :class:`BundleError` found, else return it."""
    return check(path, trusted=trusted, progress=progress).verified()


def check(
    path: str | os.PathLike[str],
    *,
    trusted: TrustFn | None = None,
    progress: ProgressFn | None = None,
) -> CheckResult:
    """Find every violation in the bundle at ``path`` (for reports that list them all).

    Violations come in check order. Parquet contents are only read from files whose size and
    sha256 match their entry, so a corrupt file yields one digest error rather than a cascade of
    misleading schema errors.
    """
    root = Path(path)
    try:
        manifest = read_manifest(root)
    except BundleError as e:
        return CheckResult(root, None, [e], None)
    errors = unbound_files(root, manifest)
    present, missing = stat_bound(root, manifest)
    hashed = hash_bound(root, manifest, present, trusted, progress)
    errors += missing + hashed.errors + check_contents(root, manifest, hashed.intact)
    digest = content_sha256((f.sha256, f.path) for f in manifest.bound_files)
    if digest != manifest.snapshot.content_sha256:
        errors.append(
            DigestMismatch(
                f"{root / fmt.MANIFEST_NAME}: content_sha256 expected "
                f"{manifest.snapshot.content_sha256}"
                f" (manifest), recomputed {digest} from the bound files' sha256 lines",
                path=fmt.MANIFEST_NAME,
            )
        )
    return CheckResult(root, manifest, errors, hashed.stats)
