"""A faithful fake of remote object storage for tests: an fsspec filesystem that demands a token.

``lithi-secure://<path>`` serves files from a local directory, but only to a filesystem created
with the right ``token`` storage option; anything else gets ``PermissionError`` on every call,
as a real store answers 403. It also records which paths were opened, so a test can prove what a
client did not read.
"""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
from fsspec.spec import AbstractFileSystem

PROTOCOL = "lithi-secure"


class SecureFakeFS(AbstractFileSystem):
    """Serves ``served_root`` to holders of ``expected_token``; see :func:`serve`."""

    protocol = PROTOCOL
    served_root: Path | None = None
    expected_token: str | None = None
    opened: list[str] = []

    def __init__(self, token: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._token = token

    def _local(self, path: str) -> Path:
        if self.served_root is None or self.expected_token is None:
            raise ConnectionError(f"{PROTOCOL}: nothing is being served")
        if self._token != self.expected_token:
            # like a real 403: says what is wrong, never echoes what was sent
            raise PermissionError(f"{PROTOCOL}://{path}: access denied (missing or wrong token)")
        rel = self._strip_protocol(path).lstrip("/")
        local = (self.served_root / rel).resolve()
        if not local.is_relative_to(self.served_root.resolve()):
            raise PermissionError(f"{PROTOCOL}://{path}: outside the served root")
        return local

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kw):
        if "r" not in mode:
            raise PermissionError(f"{PROTOCOL}: read-only")
        local = self._local(path)
        type(self).opened.append(self._strip_protocol(path))
        return open(local, mode)

    def info(self, path, **kwargs):
        local = self._local(path)
        if not local.exists():
            raise FileNotFoundError(path)
        kind = "directory" if local.is_dir() else "file"
        return {"name": self._strip_protocol(path), "size": local.stat().st_size, "type": kind}

    def ls(self, path, detail=True, **kwargs):
        local = self._local(path)
        if not local.is_dir():
            raise FileNotFoundError(path)
        base = self._strip_protocol(path).rstrip("/")
        entries = [self.info(f"{base}/{name}") for name in sorted(os.listdir(local))]
        return entries if detail else [e["name"] for e in entries]


def serve(root: Path, token: str) -> None:
    """Serve ``root`` under ``lithi-secure://`` to holders of ``token`` (registers the protocol)."""
    fsspec.register_implementation(PROTOCOL, SecureFakeFS, clobber=True)
    SecureFakeFS.served_root = Path(root)
    SecureFakeFS.expected_token = token
    SecureFakeFS.opened = []
    SecureFakeFS.clear_instance_cache()


def stop() -> None:
    """Stop serving (later calls fail as if the store were unreachable)."""
    SecureFakeFS.served_root = None
    SecureFakeFS.expected_token = None
    SecureFakeFS.clear_instance_cache()
