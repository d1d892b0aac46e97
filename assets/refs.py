"""Small, picklable values the chain's assets hand to each other through the IO manager.

Only references travel between steps (URLs, paths, identities); the data itself stays in the
bundle cache and the artifacts directory, where every file is named by what it contains.
"""

from dataclasses import dataclass

from pipeline.bundle.manifest import Manifest, SnapshotId
from pipeline.bundle.verify import TrustFn, VerifiedSnapshot, verify
from pipeline.readers.index import Index


@dataclass(frozen=True)
class ManifestRef:
    """A result manifest read from Compute: where its bundle is and what it binds."""

    url: str
    manifest: Manifest
    credential_ref: str | None


@dataclass(frozen=True)
class SnapshotRef:
    """A verified local copy of a bundle in the content-addressed cache."""

    path: str
    identity: SnapshotId
    credential_ref: str | None


@dataclass(frozen=True)
class IndexRef:
    """A saved disjoint index and the snapshot it was built from."""

    path: str
    digest: str
    snapshot: SnapshotRef


def load_index(ref: IndexRef, trusted: TrustFn) -> Index:
    """Bind a saved index to its bundle, verified again (the cache vouches for what it hashed)."""
    return Index.load(ref.path, snapshot=verify_snapshot(ref.snapshot, trusted))


def verify_snapshot(ref: SnapshotRef, trusted: TrustFn) -> VerifiedSnapshot:
    """Verify the cached bundle a step received; only a VerifiedSnapshot reaches the readers."""
    return verify(ref.path, trusted=trusted)


@dataclass(frozen=True)
class TrainingRef:
    """A checkpoint and the record beside it that names the data that produced it."""

    checkpoint: str
    checkpoint_sha256: str
    record: str
    index: IndexRef


@dataclass(frozen=True)
class PredictionRef:
    """A prediction table file, one row per index item."""

    path: str
    rows: int
    id_field: str
    training: TrainingRef


@dataclass(frozen=True)
class OutputRef:
    """The staged prediction bundle."""

    path: str
    identity: SnapshotId
