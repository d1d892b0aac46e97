"""Processes that fetch one bundle into one cache at the same moment (the cache race test).

Spawned with ``multiprocessing`` (the ``spawn`` start method, so no pyarrow thread pool is
forked), each process runs :func:`fetch_rounds`: per round it waits at a barrier with the others,
fetches the bundle into that round's empty cache, verifies the view with the cache's trust, and
reports what it saw, or the error, on a queue.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def fetch_rounds(
    worker: int, url: str, cache_root: str, rounds: int, barrier: Any, results: Any
) -> None:
    """Fetch ``url`` once per round into ``cache_root/round-NN`` in step with the other workers."""
    from pipeline.bundle.verify import verify
    from resources.bundle_store import BundleStore
    from tests.helpers.timing import limit

    for r in range(rounds):
        barrier.wait(timeout=limit(300))
        try:
            store = BundleStore(Path(cache_root) / f"round-{r:02d}")
            got = store.fetch(url)
            snap = verify(got.path, trusted=store.trusted)
            inodes = tuple(os.stat(p).st_ino for p in snap.part_paths())
            results.put((worker, r, "ok", (str(got.path), snap.identity.model_dump_json(), inodes)))
        except BaseException as e:  # reported, never lost: the test counts every round
            results.put((worker, r, "error", f"{type(e).__name__}: {e}"))
