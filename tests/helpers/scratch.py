"""Where a test run keeps its files: in memory when the machine has room for them.

Most of the suite's time outside training is file system work: Dagster's SQLite storage commits
(each one an fsync), staged bundles, caches, temporary instances. On a disk shared with other
work every one of them waits its turn; in a tmpfs none does (the chain tests ran twice as fast
there on this project's 2-core machine while other work was using the disk). So a run whose
``TMPDIR`` is unset, started without ``--basetemp``, puts both into a folder of its own under
``/dev/shm`` when that has :data:`ROOM` free, and removes it when the run passes (a failed run's
files stay for a look, until the next run of the same user sweeps them). Nothing a test checks
depends on where this is.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from resources.compute.local.jobstore import pid_alive

SHM = Path("/dev/shm")
#: Free space a run needs before it takes its files to memory (a full run writes well under it).
ROOM = 4 << 30
PREFIX = f"lithi-tests-{os.getuid()}-"


def memory_root() -> Path | None:
    """``/dev/shm`` when it is a writable folder with :data:`ROOM` free, else ``None``."""
    try:
        stat = os.statvfs(SHM)
    except OSError:
        return None
    usable = SHM.is_dir() and os.access(SHM, os.W_OK | os.X_OK)
    return SHM if usable and stat.f_bavail * stat.f_frsize >= ROOM else None


def sweep(root: Path) -> None:
    """Remove the folders earlier runs of this user left under ``root`` (their pid is gone, or
    a zombie)."""
    for path in root.glob(f"{PREFIX}*"):
        pid = path.name.removeprefix(PREFIX)
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def run_folder(root: Path) -> Path:
    """A new folder for this run (named by its pid) under ``root``, after sweeping old ones."""
    sweep(root)
    path = root / f"{PREFIX}{os.getpid()}"
    path.mkdir(mode=0o700)
    return path
