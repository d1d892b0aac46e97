"""Build the torch-native DataLoader wiring for either reader in one call, resumable mid-epoch.

Map-style: ``DataLoader(MapDataset, batch_size=B, sampler=OwnerSampler, collate_fn=
collate_batches)`` — torch's ``BatchSampler`` groups the sampler's positions, each index batch
goes to one worker, and the worker's fetcher calls ``__getitems__`` once per batch. Iterable:
``DataLoader(PartIterableDataset, batch_size=None, collate_fn=collate_batches)`` — the dataset
batches itself, so torch must not batch again. :func:`make_loader` builds that wiring with the
workers sending batches in their :class:`~pipeline.readers.tensors.Wire` form (numpy and Arrow
buffers, finished into tensors and lists in the main process) and wraps it in a
:class:`ReaderLoader`, which cuts large worker messages into batches and counts what it
delivered, so ``state_dict()`` / ``load_state_dict()`` resume an epoch exactly where the
training loop stopped.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from pipeline.readers.datasets import MapDataset, OwnerSampler, PartIterableDataset
from pipeline.readers.index import Index
from pipeline.readers.owner import Owner
from pipeline.readers.tensors import Wire, wire_to_batch

#: Rows a worker sends the main process per message by default: large enough that torch's
#: fixed cost per message (one shared-memory segment per tensor) stops dominating.
TRANSFER_ROWS = 4096

#: The layout of :meth:`ReaderLoader.state_dict`; a state of another version is refused.
STATE_VERSION = 1


class ResumeMismatch(ValueError):
    """A saved loader state belongs to another split, rank or bundle than this loader's."""


def auto_transfer(batch_size: int) -> int:
    """How many batches of ``batch_size`` make one worker message of about ``TRANSFER_ROWS``."""
    return max(1, TRANSFER_ROWS // batch_size)


def make_loader(
    index: Index,
    *,
    style: Literal["map", "iterable"] = "map",
    batch_size: int = 256,
    num_workers: int = 2,
    columns: Sequence[str] | None = None,
    shuffle: bool = True,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    drop_last: bool = False,
    transfer_batches: int | None = None,
    share_decoded: bool = True,
    pin_memory: bool = False,
    **loader_kwargs: Any,
) -> ReaderLoader:
    """A resumable loader over this rank's share of ``index`` (a :class:`ReaderLoader`).

    ``set_epoch(loader, e)`` chooses the epoch; ``loader.state_dict()`` after a step and
    ``loader.load_state_dict(state)`` on a fresh loader built the same way continue that epoch
    with exactly the items not yet delivered. ``drop_last`` applies to the map-style reader only
    (whole batches of this rank's share); it drops items by design, so reconciliation will then
    report them missing.

    ``transfer_batches=k > 1`` has each worker fetch ``k * batch_size`` rows per message and
    the main process cut them into ``batch_size`` batches: torch pays a fixed cost per worker
    message (a shared-memory segment per tensor), so this is what makes batch 256 run near
    decode speed. The batches and ownership are unchanged, and so is the map-style order; the
    iterable reader's batches arrive ``k`` at a time from each worker rather than alternating
    one by one (see ``docs/readers.md``). The default (``None``) ships about
    :data:`TRANSFER_ROWS` rows per message when there are worker processes, and single batches
    otherwise or with ``drop_last`` (whose meaning would change with larger messages).

    ``share_decoded`` (map-style) lets this rank's workers share decoded parts, so each part is
    decoded once per rank rather than once per worker (see :class:`MapDataset`); ``False`` has
    each worker decode and cache its own.

    ``pin_memory`` puts every batch's tensors in page-locked memory (ask for it when the
    batches go to a CUDA device, so their copy can overlap the GPU's work). The main process
    pins each worker message once, after finishing it into tensors: torch's own ``pin_memory``
    would see only the workers' wire form (numpy arrays), which it leaves unpinned.
    """
    if transfer_batches is None:
        transfer_batches = 1 if num_workers == 0 or drop_last else auto_transfer(batch_size)
    if transfer_batches < 1:
        raise ValueError(f"transfer_batches must be >= 1, got {transfer_batches}")
    if transfer_batches > 1 and drop_last:
        raise ValueError("transfer_batches > 1 would change what drop_last drops; use 1")
    if loader_kwargs.get("in_order", True) is not True:
        raise ValueError(
            "in_order=False lets batches overtake each other, so what was delivered is no longer "
            "a prefix of the epoch and no state can resume it; keep in_order=True"
        )
    inner_batch = batch_size * transfer_batches
    if num_workers > 0:
        loader_kwargs["worker_init_fn"] = functools.partial(
            _init_worker, loader_kwargs.get("worker_init_fn")
        )
    if style == "map":
        # without worker processes there is no one to share with: no directory
        ds = MapDataset(index, columns, share_decoded=share_decoded and num_workers > 0)
        sampler = OwnerSampler(index, rank=rank, world_size=world_size, shuffle=shuffle, seed=seed)
        loader_kwargs.setdefault("persistent_workers", num_workers > 0)
        inner = DataLoader(
            _WireMap(ds),
            batch_size=inner_batch,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=_as_is,
            drop_last=drop_last,
            **loader_kwargs,
        )
        return ReaderLoader(inner, batch_size, pin_memory=pin_memory)
    if style == "iterable":
        if drop_last:
            raise ValueError("drop_last is not supported by the iterable reader")
        ids = PartIterableDataset(
            index,
            batch_size=inner_batch,
            columns=columns,
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
        )
        # workers copy the dataset when an epoch starts; persistent ones would miss set_epoch
        loader_kwargs.setdefault("persistent_workers", False)
        if num_workers > 0:
            # Batches come back in order, worker by worker, and a worker decodes a whole row
            # group at once when shuffling: with torch's 2 messages ahead, the main process
            # waits on that worker while the others sit full. A row group's worth ahead keeps
            # them decoding (measured: shuffled row groups 35-60% faster at 4,096-row messages).
            group = _row_group_rows(index)
            loader_kwargs.setdefault("prefetch_factor", min(64, max(2, -(-group // inner_batch))))
        inner = DataLoader(
            _WireIterable(ids),
            batch_size=None,
            num_workers=num_workers,
            collate_fn=_as_is,
            **loader_kwargs,
        )
        return ReaderLoader(inner, batch_size, pin_memory=pin_memory)
    raise ValueError(f"style must be 'map' or 'iterable', got {style!r}")


#: The Arrow memory pool a DataLoader worker decodes into (unless ``ARROW_DEFAULT_MEMORY_POOL``
#: names one). A worker decodes parts of tens of MB, publishes or sends them and frees them;
#: jemalloc keeps freed memory for reuse for a while, mimalloc (Arrow's default) returns it
#: to the system within milliseconds, so the next part's decode faults in fresh pages. Measured
#: on a 2-core VM, 5 alternating rounds: the cold map-style epoch took 2.0-2.5 s with jemalloc
#: in the workers against 2.0-4.6 s with mimalloc (median 2.21 s against 2.78 s).
WORKER_POOL = "jemalloc"


def _init_worker(user_init: Any, worker_id: int) -> None:
    """``worker_init_fn`` of make_loader's workers: choose the Arrow pool, then the user's."""
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


class _WireMap(Dataset):
    """What a map-style worker fetches: ``MapDataset`` batches in their wire form."""

    def __init__(self, dataset: MapDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]) -> Wire:
        return self.dataset.take_wire(indices)

    def __getitem__(self, i: int) -> Wire:
        return self.dataset.take_wire([i])


class _WireIterable(IterableDataset):
    """What an iterable worker streams: its batches in wire form, tagged with the worker.

    The main process counts delivered rows per worker-owner from the tag: a worker's own
    batches arrive in order, so each count is a prefix of that owner's stream.
    """

    def __init__(self, dataset: PartIterableDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[tuple[int, Wire]]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        return ((worker, w) for w in self.dataset.iter_wire())


def _as_is(item: Any) -> Any:
    """The ``collate_fn`` of the inner loaders: a wire batch must not be converted on the way."""
    return item


def _row_group_rows(index: Index) -> int:
    """The largest row group of the bundle's first non-empty part (from its footer)."""
    for path, rows in zip(index.part_paths, index.part_rows, strict=True):
        if rows:
            meta = pq.ParquetFile(path).metadata
            return max(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
    return 0


class ReaderLoader:
    """The loader :func:`make_loader` returns: a DataLoader's batches, cut, counted, resumable.

    Wraps a torch ``DataLoader`` whose batches hold ``k * batch_size`` rows (``k`` = the
    transfer batches, 1 for plain batches) and yields ``batch_size`` views of them. It counts
    the rows it has delivered this epoch — for the map-style reader a prefix of the
    ``OwnerSampler`` order, for the iterable reader a prefix of each worker-owner's stream — so
    :meth:`state_dict` names exactly where the training loop is, however far the workers have
    prefetched. ``len()`` is the number of batches in a whole epoch of this rank.
    """

    def __init__(self, loader: DataLoader, batch_size: int, *, pin_memory: bool = False) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.loader = loader
        self.batch_size = batch_size
        self.pin_memory = pin_memory
        self._iterable = isinstance(self.dataset, PartIterableDataset)
        self._rows: int | list[int] = self._zero_rows()
        self._pending = False  # a loaded state waits for the next __iter__
        self._untracked = False  # an untagged multi-worker iterable loader cannot be counted

    # -- what it wraps ----------------------------------------------------------------------
    @property
    def sampler(self) -> Any:
        """The inner loader's sampler (an :class:`OwnerSampler` for the map-style reader)."""
        return self.loader.sampler

    @property
    def dataset(self) -> Any:
        """The reader: the ``MapDataset`` or ``PartIterableDataset`` the workers fetch from."""
        inner = self.loader.dataset
        return inner.dataset if isinstance(inner, (_WireMap, _WireIterable)) else inner

    @property
    def transfer_batches(self) -> int:
        """Batches per worker message (the inner loader's batch size over ``batch_size``)."""
        inner = self.dataset.batch_size if self._iterable else self.loader.batch_size
        return max(1, (inner or self.batch_size) // self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration yields."""
        return self._owner().epoch

    def _owner(self) -> Any:
        target = self.dataset if self._iterable else self.sampler
        if not hasattr(target, "set_epoch"):
            raise TypeError(f"{type(target).__name__} has no set_epoch")
        return target

    def _workers(self) -> int:
        return max(self.loader.num_workers, 1)

    def _zero_rows(self) -> int | list[int]:
        return [0] * self._workers() if self._iterable else 0

    # -- epochs -----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches of ``batch_size`` in a whole epoch of this rank (a resumed one yields fewer)."""
        bs = self.batch_size
        if self._iterable:
            if self.dataset.num_workers is None:
                return sum(math.ceil(r / bs) for r in self._owner_rows_from_loader())
            return sum(math.ceil(r / bs) for r in self.dataset.owner_rows())
        n = len(self.sampler)
        return n // bs if self.loader.drop_last else math.ceil(n / bs)

    def _owner_rows_from_loader(self) -> list[int]:
        ds = self.dataset
        owners = [
            Owner(ds.rank, ds.world_size, w, self.loader.num_workers)
            for w in range(self._workers())
        ]
        return [sum(ds.index.part_rows[p] for p in ds.parts_for(o)) for o in owners]

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch to yield; a loaded mid-epoch state must be finished first.

        Setting the epoch a loaded state names keeps it (the usual restart:
        ``load_state_dict(state)`` then ``set_epoch(state["epoch"])``); setting another epoch
        drops a state whose epoch was complete and refuses one that was not, since that would
        silently skip the rest of it.
        """
        current = self.epoch
        if self._pending and epoch != current:
            left = self._rows_left()
            if left:
                raise ValueError(
                    f"the loaded state resumes epoch {current} with {left} row(s) of this rank "
                    f"not yet delivered; set_epoch({epoch}) would skip them. Iterate epoch "
                    f"{current} first, or build the loader without loading the state"
                )
            self._pending = False
        if epoch != current:
            self._rows = self._zero_rows()
        self._owner().set_epoch(epoch)

    def _totals(self) -> int | list[int]:
        if self._iterable:
            if self.dataset.num_workers is None:
                return self._owner_rows_from_loader()
            return self.dataset.owner_rows()
        n = len(self.sampler)
        if self.loader.drop_last:
            n -= n % self.loader.batch_size
        return n

    def _rows_left(self) -> int:
        total, done = self._totals(), self._rows
        if isinstance(total, list):
            return sum(t - d for t, d in zip(total, done, strict=True))
        return total - done  # type: ignore[operator]

    # -- iterating --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        epoch = self.epoch
        start = self._rows if self._pending else self._zero_rows()
        self._pending = False
        if self._iterable:
            self.dataset.load_state_dict({"epoch": epoch, "rows": list(start)})  # type: ignore[arg-type]
        elif isinstance(self.sampler, OwnerSampler):
            self.sampler.load_state_dict({"epoch": epoch, "yielded": start})
        self._rows = list(start) if isinstance(start, list) else start
        inner = iter(self.loader)  # worker processes start here, with the resume point
        _widen_result_pipe(inner)
        if self._iterable and self.loader.num_workers > 0:
            self.dataset.load_state_dict({"epoch": epoch, "rows": []})  # the workers have it
        return self._batches(inner)

    def _batches(self, inner: Iterator[Any]) -> Iterator[dict]:
        bs = self.batch_size
        for item in inner:
            worker = 0
            if self._iterable:
                if isinstance(item, tuple):
                    worker, big = item
                else:  # a DataLoader built without make_loader's worker tags
                    big = item
                    self._untracked = self._untracked or self.loader.num_workers > 1
            else:
                big = item
            if isinstance(big, Wire):
                big = wire_to_batch(big)  # here, in the main process: see Wire
            if self.pin_memory:
                big = _pinned(big)  # once per message; the batches cut from it are views
            n = _rows_of(big)
            for small in _cut(big, bs, n) if n > bs else (big,):
                # counted before it is handed over: a state taken while the training loop holds
                # this batch already includes it
                if self._iterable:
                    self._rows[worker] += _rows_of(small)  # type: ignore[index]
                else:
                    self._rows += _rows_of(small)  # type: ignore[operator]
                yield small

    def delivered_positions(self) -> np.ndarray:
        """Index positions this epoch has delivered so far, per :meth:`state_dict`'s ``rows``.

        After :meth:`load_state_dict`, these are the items the interrupted run had delivered
        before its checkpoint — what a resumed run counts as already seen when it reconciles
        the whole epoch (``index.ids.take(...)``). Computed from the state, the split and the
        Parquet footers only; no data is read.
        """
        if self._iterable:
            ds = self.dataset
            workers = self.loader.num_workers
            return np.concatenate(
                [
                    ds.stream_positions(Owner(ds.rank, ds.world_size, w, workers), r)
                    for w, r in enumerate(self._rows)  # type: ignore[arg-type]
                ]
            )
        return self._owner().positions()[: self._rows]

    # -- state ------------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        """What a state must match to resume here: the split and the bundle."""
        owner = self._owner()
        if not self._iterable and not isinstance(owner, OwnerSampler):
            raise TypeError(
                f"state_dict needs an OwnerSampler, found {type(owner).__name__}; build the "
                "loader with make_loader"
            )
        index = self.dataset.index
        ident = index.snapshot.identity
        out: dict[str, Any] = {
            "style": "iterable" if self._iterable else "map",
            "rank": owner.rank,
            "world_size": owner.world_size,
            "shuffle": owner.shuffle,
            "seed": owner.seed,
            "items": len(index),
            "snapshot": f"{ident.version_id}:{ident.content_sha256}",
        }
        if self._iterable:
            out["num_workers"] = self._workers()
        return out

    def state_dict(self) -> dict[str, Any]:
        """Where this rank's epoch stands, as small JSON-ready data: save it beside a checkpoint.

        ``rows`` is the number of rows delivered this epoch — an int (map-style: a prefix of
        the sampler's order) or one int per worker-owner (iterable: a prefix of each owner's
        stream) — next to ``epoch`` and the parameters a resume must match (rank, world size,
        seed, shuffle, worker-owners, items and snapshot). No ids, no tensors.
        """
        if self._untracked:
            raise TypeError(
                "this iterable loader's batches carry no worker tag, so rows cannot be counted "
                "per worker-owner; build it with make_loader"
            )
        rows = list(self._rows) if isinstance(self._rows, list) else self._rows
        return {
            "version": STATE_VERSION,
            **self._identity(),
            "epoch": self.epoch,
            "batch_size": self.batch_size,
            "rows": rows,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from ``state_dict`` (from :meth:`state_dict`): call it before iterating.

        The next iteration yields the rest of the saved epoch — exactly the rows not delivered
        before the state was taken, each once — skipping what was delivered without reading it
        (the iterable reader decodes at most the one row group holding its resume point again).
        A state of another rank, split or bundle raises :class:`ResumeMismatch`. The batch size
        may differ; batch boundaries then follow the new size.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict needs a dict, found {type(state_dict).__name__}")
        if state_dict.get("version") != STATE_VERSION:
            raise ResumeMismatch(
                f"loader state version {state_dict.get('version')!r}; this loader reads "
                f"version {STATE_VERSION}"
            )
        mine = self._identity()
        differ = [
            f"{k}: saved {state_dict.get(k)!r}, this loader {v!r}"
            for k, v in mine.items()
            if state_dict.get(k) != v
        ]
        if differ:
            raise ResumeMismatch(
                "the state belongs to another loader (build this one with the same split "
                "parameters on the same bundle and rank): " + "; ".join(differ)
            )
        epoch, rows = state_dict.get("epoch"), state_dict.get("rows")
        if not _is_count(epoch):
            raise ValueError(f"loader state needs 'epoch' as an int >= 0, found {epoch!r}")
        total = self._totals()  # ownership never depends on the epoch, so neither do these
        if isinstance(total, list):
            ok = (
                isinstance(rows, list)
                and len(rows) == len(total)
                and all(_is_count(r) and r <= t for r, t in zip(rows, total, strict=True))
            )
        else:
            ok = _is_count(rows) and rows <= total  # type: ignore[operator]
        if not ok:
            raise ValueError(
                f"loader state 'rows' {rows!r} does not fit this rank's epoch (rows per "
                f"{'worker-owner' if isinstance(total, list) else 'rank'}: {total!r})"
            )
        self._owner().set_epoch(epoch)
        self._rows = list(rows) if isinstance(rows, list) else rows  # type: ignore[arg-type]
        self._pending = True


#: Bytes the worker-to-main pipe buffers (Linux ``F_SETPIPE_SZ``; 1 MiB is the default most a
#: user may ask for). With the default 64 KiB, a 1 MiB message crosses in 16 rounds of the
#: writer blocking and the reader waking: measured, the main process spent 1.5-4x the CPU reading
#: 256 MiB of messages, and the workers waited on it.
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031


def _widen_result_pipe(iterator: Any) -> None:
    """Give the pipe the workers send batches through a :data:`PIPE_BYTES` buffer, if possible.

    The pipe is torch's (``_worker_result_queue``, a ``multiprocessing.Queue``): reached through
    private attributes, so anything unexpected — another torch, another platform, a user's
    pipe limit reached — leaves it as it is. Only the speed differs.
    """
    try:
        import fcntl

        fd = iterator._worker_result_queue._reader.fileno()
        want = pipe_bytes()
        if fcntl.fcntl(fd, _F_SETPIPE_SZ - 1) < want:  # F_GETPIPE_SZ
            fcntl.fcntl(fd, _F_SETPIPE_SZ, want)
    except (AttributeError, ImportError, OSError, ValueError):
        pass


def pipe_bytes() -> int:
    """:data:`PIPE_BYTES`, or less if this machine lets a user's pipe hold less."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return min(PIPE_BYTES, int(f.read()))
    except (OSError, ValueError):
        return PIPE_BYTES


def _pinned(batch: dict) -> dict:
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _rows_of(batch: dict) -> int:
    return len(next(iter(batch.values())))


def _cut(batch: dict, size: int, n: int) -> Iterator[dict]:
    """``batch`` (``n`` rows) as consecutive batches of ``size`` rows (views, not copies).

    ``torch.split`` makes all of a tensor's views in one call, at half the cost of one
    ``narrow`` per batch and column (measured at batch 256; that cost is the main process's).
    """
    columns = [
        torch.split(v, size)
        if isinstance(v, torch.Tensor)
        else [v[i : i + size] for i in range(0, n, size)]
        for v in batch.values()
    ]
    keys = list(batch)
    return (dict(zip(keys, values, strict=True)) for values in zip(*columns, strict=True))


#: The former name of :class:`ReaderLoader` (it wrapped only loaders of large messages).
SplitLoader = ReaderLoader


def set_epoch(loader: ReaderLoader | DataLoader, epoch: int) -> None:
    """Tell a loader which epoch's order to produce (a :class:`ReaderLoader` or a DataLoader)."""
    if isinstance(loader, ReaderLoader):
        loader.set_epoch(epoch)
        return
    target = loader.sampler if isinstance(loader.sampler, OwnerSampler) else loader.dataset
    if not hasattr(target, "set_epoch"):
        raise TypeError(f"{type(target).__name__} has no set_epoch")
    target.set_epoch(epoch)
