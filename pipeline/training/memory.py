"""Keep a long training or prediction loop's resident memory at its working set (glibc heaps).

Every batch allocates large temporaries (features, activations: hundreds of KB each) and keeps
a few small objects for the whole pass (the Arrow arrays of ids and statuses the pipeline tallies
and the predictions collect). glibc serves large blocks with ``mmap`` until a freed one raises its
dynamic threshold; from then on they come from the heap, the small survivors land between them,
and the heap can never shrink: a pass over millions of items then holds many times its live data
(docs/performance.md, "Why, step by step", memory). A fixed threshold (which also turns the
dynamic adjustment off, see ``mallopt(3)``) keeps every large block in its own mapping, returned
on free, so the same loop stays at its live data. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
#: Blocks from this size up are mapped on their own: glibc's initial threshold, kept fixed.
MMAP_THRESHOLD = 128 * 1024
_done = False


def bound_heap_growth() -> bool:
    """Fix glibc's mmap threshold for this process (once); whether it could be set."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    _done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return _done
