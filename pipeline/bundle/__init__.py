"""The on-disk contract: bundle format v1, its manifest, staging and verification.

Needs only pyarrow, numpy and pydantic (never torch, never Dagster), so checking a bundle is cheap
anywhere. A bundle is written with :func:`stage` (parts first, manifest last, one atomic rename)
and read only after :func:`verify` returned a :class:`VerifiedSnapshot`.
"""

from pipeline.bundle.errors import (
    BundleError,
    BundleExists,
    CountMismatch,
    DigestMismatch,
    DuplicateIds,
    IdentifierError,
    IncompleteBundle,
    ManifestInvalid,
    MissingFile,
    NotVerified,
    RowCountMismatch,
    SchemaMismatch,
    SizeMismatch,
    StatusMismatch,
    UnboundFile,
    UnreadableFile,
    UnsafePath,
)
from pipeline.bundle.manifest import (
    Counts,
    FileEntry,
    InputRef,
    JobInfo,
    Manifest,
    Schema,
    SchemaField,
    SnapshotId,
    parse_manifest,
)
from pipeline.bundle.stage import ReusedPart, new_version_id, stage
from pipeline.bundle.verify import (
    CheckResult,
    VerifiedSnapshot,
    VerifyStats,
    check,
    read_manifest,
    require_verified,
    verify,
)

__all__ = [
    "BundleError",
    "BundleExists",
    "CheckResult",
    "CountMismatch",
    "Counts",
    "DigestMismatch",
    "DuplicateIds",
    "FileEntry",
    "IdentifierError",
    "IncompleteBundle",
    "InputRef",
    "JobInfo",
    "Manifest",
    "ManifestInvalid",
    "MissingFile",
    "NotVerified",
    "ReusedPart",
    "RowCountMismatch",
    "Schema",
    "SchemaField",
    "SchemaMismatch",
    "SizeMismatch",
    "SnapshotId",
    "StatusMismatch",
    "UnboundFile",
    "UnreadableFile",
    "UnsafePath",
    "VerifiedSnapshot",
    "VerifyStats",
    "check",
    "new_version_id",
    "parse_manifest",
    "read_manifest",
    "require_verified",
    "stage",
    "verify",
]
