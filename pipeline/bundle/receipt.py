"""Verification receipts: a bundle checked once in full is loaded again with a stat per file.

:func:`~pipeline.bundle.verify.verify` decodes every part (row counts, schemas, every id for
uniqueness), and a chain run loads its snapshot again in every step after the one that verified
it. A receipt, written when a full verification passes, records the manifest's sha256 and the
fingerprint (:mod:`pipeline.bundle.fingerprint`) of the manifest and of every bound file, taken
before the check began and again after it ended, so a file that changed while it was read gets
no receipt. A later :func:`verify_once` that finds the same manifest, every file with the same
fingerprint and nothing unbound beside them returns the snapshot without reading a part: a
``stat`` per file and two directory listings. Anything else (a rewritten or replaced file, even
one whose size and mtime were put back, since that changes its ctime; a new hard link; another
manifest) is verified in full again, and a bundle that no longer passes is refused as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import atomic_write_text
from pipeline.bundle.digest import sha256_bytes
from pipeline.bundle.errors import BundleError
from pipeline.bundle.files import (
    ProgressFn,
    TrustFn,
    VerifyStats,
    read_manifest_bytes,
    unbound_files,
)
from pipeline.bundle.fingerprint import Fingerprint, matches
from pipeline.bundle.manifest import Manifest, parse_manifest
from pipeline.bundle.verify import CheckResult, VerifiedSnapshot, check

RECEIPT_VERSION = 1


class Receipt(BaseModel):
    """What a passed verification vouches for, as long as every fingerprint still holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    receipt_version: int
    root: str
    manifest_sha256: str
    fingerprints: dict[str, dict[str, int]]


def verify_once(
    path: str | os.PathLike[str], receipt_path: str | os.PathLike[str], **kw: Any
) -> VerifiedSnapshot:
    """The bundle at ``path`` verified: by its receipt at ``receipt_path`` when that still
    holds, else in full (:func:`~pipeline.bundle.verify.verify`, with its keyword options),
    writing a new receipt."""
    return check_once(path, receipt_path, **kw).verified()


def check_once(
    path: str | os.PathLike[str],
    receipt_path: str | os.PathLike[str],
    *,
    trusted: TrustFn | None = None,
    progress: ProgressFn | None = None,
) -> CheckResult:
    """:func:`~pipeline.bundle.verify.check` (every violation listed), answered by the receipt
    at ``receipt_path`` while it holds; a bundle that passes in full gets a new receipt."""
    root = Path(path).resolve()
    held = by_receipt(root, Path(receipt_path))
    if held is not None:
        return CheckResult(root, held.manifest, [], held.stats)
    try:
        raw = read_manifest_bytes(root)
        before = _fingerprints(root, parse_manifest(raw, path=str(root / fmt.MANIFEST_NAME)))
    except BundleError:  # no manifest, or not a valid one: check says so
        raw, before = b"", None
    result = check(root, trusted=trusted, progress=progress)
    if result.ok and before is not None and result.manifest is not None:
        after = _fingerprints(root, result.manifest)
        if before == after:  # nothing changed while it was read
            _write(receipt_path, root, raw, after)
    return result


def _write(
    receipt_path: str | os.PathLike[str], root: Path, raw: bytes, prints: dict[str, Fingerprint]
) -> None:
    receipt = Receipt(
        receipt_version=RECEIPT_VERSION,
        root=str(root),
        manifest_sha256=sha256_bytes(raw),
        fingerprints={p: fp.as_dict() for p, fp in prints.items()},
    )
    try:
        Path(receipt_path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(receipt_path, receipt.model_dump_json())
    except OSError:  # a read-only cache cannot remember: the next load verifies in full
        pass


def by_receipt(root: Path, receipt_path: Path) -> VerifiedSnapshot | None:
    """The snapshot at ``root`` if the receipt at ``receipt_path`` still vouches for every file
    of it, else ``None`` (no receipt, another bundle's, or any file changed)."""
    try:
        receipt = Receipt.model_validate_json(receipt_path.read_bytes())
    except (OSError, ValidationError):
        return None
    if receipt.receipt_version != RECEIPT_VERSION or receipt.root != str(root):
        return None
    try:
        raw = read_manifest_bytes(root)
        if sha256_bytes(raw) != receipt.manifest_sha256:
            return None
        manifest = parse_manifest(raw, path=str(root / fmt.MANIFEST_NAME))
    except BundleError:  # gone or unreadable: the full verification says what is wrong
        return None
    if set(receipt.fingerprints) != _named(manifest):
        return None
    for rel, recorded in receipt.fingerprints.items():
        try:
            expected = Fingerprint.from_dict(recorded)
        except ValueError:
            return None
        if not matches(root / rel, expected):
            return None
    if unbound_files(root, manifest):
        return None
    files = manifest.bound_files
    stats = VerifyStats(
        files_total=len(files),
        bytes_total=sum(f.bytes for f in files),
        files_hashed=0,
        bytes_hashed=0,
    )
    return VerifiedSnapshot(root=root, manifest=manifest, stats=stats)


def _named(manifest: Manifest) -> set[str]:
    return {f.path for f in manifest.bound_files} | {fmt.MANIFEST_NAME}


def _fingerprints(root: Path, manifest: Manifest) -> dict[str, Fingerprint] | None:
    """Every named file's fingerprint now; ``None`` if one cannot be taken (it is missing, and
    the verification will say so)."""
    try:
        return {rel: Fingerprint.of(root / rel) for rel in sorted(_named(manifest))}
    except OSError:
        return None
