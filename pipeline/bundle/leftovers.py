"""Work in progress a killed process leaves behind: named after its owner, swept once it is gone.

A staging folder or a temporary file is renamed into place when its work is done; a process
killed before that leaves it. Each such name carries its owner, ``<pid>-<host>`` (the host as a
short digest of its name, so a folder on a filesystem several machines share is judged only by
the machine that made it), and the next process that works in the same place removes the ones
whose owner is no longer running. A name without an owner is never touched.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import socket
from pathlib import Path

#: The longest file name most filesystems take, in bytes (ext4, xfs, btrfs, tmpfs).
NAME_MAX = 255

_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_OWNED = re.compile(r"\.(?P<tag>[a-z]+)-(?P<pid>\d+)-(?P<host>[0-9a-f]{8})(?:-[0-9a-f]{12})?$")


def owner() -> str:
    """This process as an owner: ``<pid>-<host>``."""
    return f"{os.getpid()}-{_HOST}"


def work_name(path: str | os.PathLike[str], tag: str) -> Path:
    """A fresh hidden name beside ``path`` for work in progress: ``.<name>.<tag>-<owner>-<hex>``.

    ``<name>`` is cut (on a UTF-8 boundary) so the whole stays within :data:`NAME_MAX` bytes:
    any name the filesystem takes for ``path`` has a work-in-progress sibling too.
    """
    path = Path(path)
    suffix = f".{tag}-{owner()}-{secrets.token_hex(6)}"
    room = NAME_MAX - 1 - len(suffix.encode())
    name = path.name.encode()[:room].decode("utf-8", "ignore")
    return path.with_name(f".{name}{suffix}")


def owned_name(name: str, tag: str) -> str:
    """``<name>.<tag>-<owner>``: a visible name that :func:`sweep` can judge too."""
    return f"{name}.{tag}-{owner()}"


def owner_gone(name: str, tag: str) -> bool:
    """Whether ``name`` is work with tag ``tag`` whose owner, on this host, has exited."""
    m = _OWNED.search(name)
    if m is None or m["tag"] != tag or m["host"] != _HOST:
        return False
    pid = int(m["pid"])
    return pid != os.getpid() and not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists here (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def sweep(parent: str | os.PathLike[str], tag: str) -> list[str]:
    """Remove what exited owners left in ``parent`` with tag ``tag``; return the names removed."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not owner_gone(entry.name, tag):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                _writable(Path(entry.path))
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(entry.name)
        except FileNotFoundError:  # another process swept it first
            continue
        except OSError:
            continue  # not ours to remove after all (permissions): leave it
    return removed


def _writable(root: Path) -> None:
    """Let rmtree remove a folder's read-only files' directory entries (a staged bundle's)."""
    for d, _, _ in os.walk(root):
        try:
            os.chmod(d, 0o755)
        except OSError:
            pass
