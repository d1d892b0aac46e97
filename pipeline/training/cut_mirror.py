"""Mid-fit cuts kept at a URL as well as on the rank's own disk, for ranks on separate machines.

With no filesystem shared between nodes, a cut written only to a node's local disk dies with
that node, and a fit resumed on the nodes left could not read the dead rank's part. A
:class:`CutMirror` copies every rank's part to one location all nodes reach (``s3://`` or any
fsspec URL), the commit marker after every part, and hands the last committed cut back to a
fresh local directory before a fit looks for it. The local directory stays the working copy:
:class:`~pipeline.training.progress.Progress` reads and writes it as it always does.

The filesystem object comes from the caller (with whatever credentials its store resolved), so
this module never sees a secret.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
from pathlib import Path

import fsspec  # type: ignore[import-untyped]

from pipeline.bundle.atomic import atomic_write_bytes

#: The commit marker's name, in the mirror as on disk.
COMMITTED = "committed.json"
#: A cut's folder, by the step it was taken after (names sort by step).
CUT = "step-{:010d}"


class CutMirror:
    """The cuts of one fit under ``root`` on ``fs``: pushed part by part, pulled as a whole."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")

    def __repr__(self) -> str:
        return f"CutMirror({self.fs.protocol!r}, {self.root!r})"

    def _path(self, rel: str) -> str:
        return posixpath.join(self.root, rel)

    def push(self, local: Path, rel: str) -> None:
        """Copy the local file ``local`` to ``rel`` under the mirror (an object store writes
        it whole or not at all; a later push of the same name replaces it)."""
        dest = self._path(rel)
        self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)  # a local mirror needs its folder
        self.fs.put_file(os.fspath(local), dest)

    def prune(self, keep: str) -> None:
        """Remove every cut folder older than ``keep`` (``step-…`` names sort by step)."""
        try:
            names = [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith("step-") and name < keep:
                self.fs.rm(self._path(name), recursive=True)

    def clear(self) -> None:
        """Remove every cut: the fit finished."""
        try:
            self.fs.rm(self.root, recursive=True)
        except FileNotFoundError:
            pass

    def pull(self, local: Path) -> int | None:
        """Copy the last committed cut into the directory ``local``, marker last; its step, or
        ``None`` where the mirror holds no committed cut (``local`` is then left as it was)."""
        try:
            committed = self.fs.cat_file(self._path(COMMITTED))
        except FileNotFoundError:
            return None
        step = int(json.loads(committed)["step"])
        cut = CUT.format(step)
        dest = local / cut
        dest.mkdir(parents=True, exist_ok=True)
        for remote in self.fs.ls(self._path(cut), detail=False):
            name = posixpath.basename(remote.rstrip("/"))
            # Through a temporary name: two ranks of one node may pull into one directory.
            fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{name}.")
            os.close(fd)
            self.fs.get_file(remote, tmp)
            os.replace(tmp, dest / name)
        atomic_write_bytes(local / COMMITTED, committed)
        return step
