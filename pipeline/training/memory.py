"""Keep Python's collector off the heap a long training or prediction loop starts with.

Why not glibc's heap as well: an earlier round fixed glibc's mmap threshold at 128 KiB so that a
pass over millions of items could not leave gigabytes of fragmented heap behind. It cost every
model step a fresh mapping and its page faults per large temporary (a training step 1.4x slower),
and once the pipeline stopped keeping Python objects per id, the fragmentation it guarded against
no longer happened: peak RSS at 10^7 items is the same without it (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Python's collector leaves what exists now alone inside the block (``gc.freeze``).

    A training or prediction loop makes short-lived objects by the million (autograd nodes,
    batches); each time they trigger a full collection, the collector would otherwise walk
    every object the process already held too (Dagster, torch and pyarrow's modules, the
    index), over and over. Objects made inside the block are collected as usual; the frozen
    ones rejoin the collector when it ends. Where something froze objects already (an outer
    block, a server preparing to fork), that is left as it is: unfreezing is all or nothing.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
