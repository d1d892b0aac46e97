"""A file's fingerprint: what vouches for its bytes without reading them again, within limits.

A digest computed once can be trusted later only for the very same file, unchanged: same device
and inode, same size, same modification time and same status-change time. Replacing a file
changes its inode; rewriting it in place changes its mtime, and even a process that puts the
mtime back (``os.utime``) changes the ctime, which only root can set. This is the trust the
bundle cache's ledger records for objects it hashed on arrival, and what
:func:`~pipeline.bundle.stage.stage` uses to verify the parts it just hashed without hashing them
twice. A new hard link or a ``chmod`` changes the ctime too: whoever makes one (the cache, when it
links an object into a view) records the fingerprint again, and anything else is re-hashed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Fingerprint:
    """Device, inode, size, mtime and ctime of one file."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> Fingerprint:
        """The fingerprint of ``path`` now (follows no symlink: a link is never a bound file)."""
        st = os.lstat(path)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def differs_only_in_ctime(self, other: Fingerprint) -> bool:
        """Whether only the ctime differs: what a new link or a ``chmod`` does to a file."""
        return self.ctime_ns != other.ctime_ns and (
            (self.dev, self.ino, self.size, self.mtime_ns)
            == (other.dev, other.ino, other.size, other.mtime_ns)
        )

    def as_dict(self) -> dict[str, int]:
        """Plain data for a ledger or a record."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, int]) -> Fingerprint:
        """The inverse of :meth:`as_dict`; ``ValueError`` on anything else (a fingerprint
        recorded before ctimes were, too: what it vouched for is hashed again)."""
        try:
            return cls(**{k: int(data[k]) for k in ("dev", "ino", "size", "mtime_ns", "ctime_ns")})
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a fingerprint: {data!r:.200}") from e


def matches(path: str | os.PathLike[str], expected: Fingerprint | None) -> bool:
    """Whether ``path`` exists and still has the fingerprint ``expected``."""
    if expected is None:
        return False
    try:
        return Fingerprint.of(path) == expected
    except OSError:
        return False


def trust_recorded(prints: Mapping[str, Fingerprint]) -> Callable[[Path, object], bool]:
    """A ``trusted(path, entry)`` for :func:`~pipeline.bundle.verify.verify`: a file is trusted
    only when ``prints[entry.path]`` still describes it."""

    def trusted(path: Path, entry: object) -> bool:
        return matches(path, prints.get(getattr(entry, "path", "")))

    return trusted
