"""Tune the DataLoader worker processes make_loader starts, and the pipe they send through.

Private, like torch's ``utils/data/_utils/worker.py``: :func:`_init_worker` is the
``worker_init_fn`` of make_loader's workers (it chooses their Arrow memory pool),
:func:`_prefetch_factor` how far ahead an iterable worker may run, and
:func:`_widen_result_pipe` gives the pipe their messages cross a larger buffer. None of them
changes what is read; only the speed differs. :class:`WireMap` and :class:`WireIterable` are
what the workers iterate: the readers' batches in wire form, tagged for the main process's count.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from pipeline.readers import lifetime
from pipeline.readers.derive import Derive, derived_wire
from pipeline.readers.index import Index
from pipeline.readers.tensors import Wire

if TYPE_CHECKING:
    from pipeline.readers.iterable import PartIterableDataset
    from pipeline.readers.map_style import MapDataset

#: The Arrow memory pool a DataLoader worker decodes into (unless ``ARROW_DEFAULT_MEMORY_POOL``
#: names one). A worker decodes parts of tens of MB, publishes or sends them and frees them;
#: jemalloc keeps freed memory for reuse for a while, mimalloc (Arrow's default) returns it to
#: the system within milliseconds, so the next part's decode faults in fresh pages (see
#: docs/readers.md, "Worker memory pool").
WORKER_POOL = "jemalloc"

#: Bytes the worker-to-main pipe buffers (Linux ``F_SETPIPE_SZ``; 1 MiB is the default most a
#: user may ask for). With the default 64 KiB, a 1 MiB message crosses in 16 rounds of the
#: writer blocking and the reader waking, which costs the main process CPU and keeps the workers
#: waiting (see docs/readers.md, "Worker pipe").
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031


def _init_worker(user_init: Callable[[int], object] | None, worker_id: int) -> None:
    """``worker_init_fn`` of make_loader's workers: die with the reader, choose the Arrow pool,
    then the user's."""
    lifetime.tie_worker_to_parent()
    use_worker_pool()
    if user_init is not None:
        user_init(worker_id)


def use_worker_pool() -> str:
    """Make :data:`WORKER_POOL` this process's Arrow pool, unless the user chose one through
    ``ARROW_DEFAULT_MEMORY_POOL`` or this pyarrow lacks it; returns the pool in use."""
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pa.set_memory_pool(getattr(pa, f"{WORKER_POOL}_memory_pool")())
        except (AttributeError, NotImplementedError):  # a build without it: keep the default
            pass
    return pa.default_memory_pool().backend_name


def _prefetch_factor(index: Index, message_rows: int) -> int:
    """Messages each iterable worker may run ahead: about one row group's worth, 2 to 64.

    Batches come back in order, worker by worker, and a worker decodes a whole row group at once
    when shuffling: with torch's 2 messages ahead, the main process waits on that worker while
    the others sit full. A row group's worth ahead keeps them decoding (see docs/readers.md,
    "Prefetch a row group ahead").
    """
    return min(64, max(2, -(-_row_group_rows(index) // message_rows)))


def _row_group_rows(index: Index) -> int:
    """The largest row group of the bundle's first non-empty part (from its footer)."""
    for path, rows in zip(index.part_paths, index.part_rows, strict=True):
        if rows:
            meta = pq.ParquetFile(path).metadata
            return max(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
    return 0


def _widen_result_pipe(iterator: Any) -> None:
    """Give the pipe the workers send batches through a :data:`PIPE_BYTES` buffer, if possible.

    The pipe is torch's (``_worker_result_queue``, a ``multiprocessing.Queue``): reached through
    private attributes, so anything unexpected — another torch, another platform, a user's
    pipe limit reached, a loader without workers — leaves it as it is. Only the speed differs.
    """
    try:
        import fcntl

        fd = iterator._worker_result_queue._reader.fileno()
        want = _pipe_bytes()
        if fcntl.fcntl(fd, _F_SETPIPE_SZ - 1) < want:  # F_GETPIPE_SZ
            fcntl.fcntl(fd, _F_SETPIPE_SZ, want)
    except (AttributeError, ImportError, OSError, ValueError):
        pass


def _pipe_bytes() -> int:
    """:data:`PIPE_BYTES`, or less if this machine lets a user's pipe hold less."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return min(PIPE_BYTES, int(f.read()))
    except (OSError, ValueError):
        return PIPE_BYTES


class _Deriving:
    """The loader's derive function (:mod:`pipeline.readers.derive`), applied to each message
    where it is read; ``None`` sends the columns read."""

    derive: Derive | None = None
    id_field: str = ""

    def _derived(self, wire: Wire) -> Wire:
        return wire if self.derive is None else derived_wire(wire, self.derive, self.id_field)


class WireMap(_Deriving, Dataset):
    """What a map-style worker fetches: ``MapDataset`` batches in their wire form.

    Tagged with prefix 0, like the iterable reader's worker tags: a map-style epoch is one
    prefix of the sampler's order, whichever worker fetched a batch.
    """

    def __init__(self, dataset: MapDataset) -> None:
        self.dataset = dataset
        self.id_field = dataset.index.id_field

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]) -> tuple[int, Wire]:
        return 0, self._derived(self.dataset.take_wire(indices))

    def __getitem__(self, i: int) -> tuple[int, Wire]:
        return self.__getitems__([i])


class WireIterable(_Deriving, IterableDataset):
    """What an iterable worker streams: its batches in wire form, tagged with the worker.

    The main process counts delivered rows per worker-owner from the tag: a worker's own
    batches arrive in order, so each count is a prefix of that owner's stream.
    """

    def __init__(self, dataset: PartIterableDataset) -> None:
        self.dataset = dataset
        self.id_field = dataset.index.id_field

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[tuple[int, Wire]]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        return ((worker, self._derived(w)) for w in self.dataset.iter_wire())


def as_is(item: Any) -> Any:
    """The ``collate_fn`` of the inner loaders: a wire batch must not be converted on the way."""
    return item
