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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from pipeline.readers import _worker, lifetime
from pipeline.readers._progress import IterableProgress, MapProgress, Progress
from pipeline.readers.derive import Derive, Summary
from pipeline.readers.index import Index
from pipeline.readers.iterable import PartIterableDataset
from pipeline.readers.map_style import MapDataset
from pipeline.readers.reshard import legs_from_state
from pipeline.readers.resume import (
    STATE_VERSION,
    ResumeMismatch,
    check_version,
    differences,
    is_merged,
)
from pipeline.readers.sampler import OwnerSampler, is_count
from pipeline.readers.tensors import Batch, Wire, wire_to_batch

#: Rows a worker sends the main process per message by default: large enough that torch's
#: fixed cost per message (one shared-memory segment per tensor) stops dominating.
TRANSFER_ROWS = 4096


def _auto_transfer(batch_size: int) -> int:
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
    mix: bool = False,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    drop_last: bool = False,
    transfer_batches: int | None = None,
    share_decoded: bool = True,
    pin_memory: bool = False,
    derive: Derive | None = None,
    **loader_kwargs: Any,
) -> ReaderLoader:
    """A resumable loader over this rank's share of ``index`` (a :class:`ReaderLoader`).

    ``set_epoch(loader, e)`` chooses the epoch; ``loader.state_dict()`` after a step and
    ``loader.load_state_dict(state)`` on a fresh loader built the same way continue that epoch
    with exactly the items not yet delivered. ``drop_last`` (map-style only) drops the last
    partial batch of this rank's share by design, so reconciliation reports those items missing.

    ``transfer_batches=k`` has each worker send ``k * batch_size`` rows per message, cut into
    ``batch_size`` batches in the main process, since torch pays a fixed cost per message (see
    docs/readers.md, "Speed"). Batches, ownership and the map-style order are unchanged; the
    iterable reader's batches arrive ``k`` at a time from each worker. The default is about
    :data:`TRANSFER_ROWS` rows per message with worker processes, and 1 without them or with
    ``drop_last`` (whose meaning larger messages would change). ``share_decoded`` (map-style)
    has this rank's workers share decoded parts (see :class:`MapDataset`). ``pin_memory`` pins
    every batch's tensors (for a CUDA device), once per message in the main process: torch's
    own ``pin_memory`` would see only the workers' wire form, numpy arrays it leaves unpinned.
    ``mix`` (with ``shuffle``) draws ownership per epoch so every rank reads from every part and
    an iterable batch from several row groups (see :mod:`pipeline.readers.mix`). ``derive``
    computes tensors from each batch where it is read, in place of its columns (see
    :meth:`ReaderLoader.set_derive`).
    """
    if transfer_batches is None:
        transfer_batches = 1 if num_workers == 0 or drop_last else _auto_transfer(batch_size)
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
            _worker._init_worker, loader_kwargs.get("worker_init_fn")
        )
    progress: Progress
    if style == "map":
        # without worker processes there is no one to share with: no directory
        ds = MapDataset(index, columns, share_decoded=share_decoded and num_workers > 0)
        sampler = OwnerSampler(
            index, rank=rank, world_size=world_size, shuffle=shuffle, seed=seed, mix=mix
        )
        loader_kwargs.setdefault("persistent_workers", num_workers > 0)
        inner = DataLoader(
            _worker.WireMap(ds),
            batch_size=inner_batch,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=_worker.as_is,
            drop_last=drop_last,
            **loader_kwargs,
        )
        progress = MapProgress(sampler, ds, inner_batch if drop_last else 0)
    elif style == "iterable":
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
            mix=mix,
        )
        # workers copy the dataset when an epoch starts; persistent ones would miss set_epoch
        loader_kwargs.setdefault("persistent_workers", False)
        if num_workers > 0:
            prefetch = _worker._prefetch_factor(index, inner_batch)
            loader_kwargs.setdefault("prefetch_factor", prefetch)
        inner = DataLoader(
            _worker.WireIterable(ids),
            batch_size=None,
            num_workers=num_workers,
            collate_fn=_worker.as_is,
            **loader_kwargs,
        )
        progress = IterableProgress(ids)
    else:
        raise ValueError(f"style must be 'map' or 'iterable', got {style!r}")
    loader = ReaderLoader(
        inner, batch_size, progress, transfer_batches=transfer_batches, pin_memory=pin_memory
    )
    loader.set_derive(derive)
    return loader


class ReaderLoader:
    """The loader :func:`make_loader` returns: a DataLoader's batches, cut, counted, resumable.

    Wraps a torch ``DataLoader`` whose batches hold ``k * batch_size`` rows (``k`` = the
    transfer batches, 1 for plain batches) and yields ``batch_size`` views of them. It counts
    the rows it has delivered this epoch — for the map-style reader a prefix of the
    ``OwnerSampler`` order, for the iterable reader a prefix of each worker-owner's stream — so
    :meth:`state_dict` names exactly where the training loop is, however far the workers have
    prefetched. ``len()`` is the number of batches in a whole epoch of this rank. Only
    :func:`make_loader` builds one: it tags the workers' messages the counting relies on.
    """

    def __init__(
        self,
        loader: DataLoader,
        batch_size: int,
        progress: Progress,
        *,
        transfer_batches: int = 1,
        pin_memory: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.loader = loader
        self.batch_size = batch_size
        #: Batches per worker message (the inner loader's batch size over ``batch_size``).
        self.transfer_batches = transfer_batches
        self._message_rows = batch_size * transfer_batches
        self.pin_memory = pin_memory
        self._progress = progress
        self._pending = False  # a loaded state waits for the next __iter__

    # -- what it wraps ----------------------------------------------------------------------
    @property
    def sampler(self) -> Sampler[Any] | Iterable[Any]:
        """The inner loader's sampler (an :class:`OwnerSampler` for the map-style reader)."""
        return self.loader.sampler

    @property
    def dataset(self) -> MapDataset | PartIterableDataset:
        """The reader: the ``MapDataset`` or ``PartIterableDataset`` the workers fetch from."""
        return self._progress.dataset

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration yields."""
        return self._progress.reader.epoch

    @property
    def num_workers(self) -> int:
        """The DataLoader worker processes that read for it (0: read in this process)."""
        return self.loader.num_workers

    @property
    def message_rows(self) -> int:
        """Rows per worker message: the most one batch can hold without joining messages."""
        return self._message_rows

    # -- epochs -----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches of ``batch_size`` in a whole epoch of this rank (a resumed one yields fewer)."""
        return sum(math.ceil(t / self.batch_size) for t in self._progress.totals)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch to yield; a loaded mid-epoch state must be finished first.

        Setting the epoch a loaded state names keeps it (the usual restart:
        ``load_state_dict(state)`` then ``set_epoch(state["epoch"])``); setting another epoch
        drops a state whose epoch was complete and refuses one that was not, since that would
        silently skip the rest of it.
        """
        current = self.epoch
        if self._pending and epoch != current:
            left = self._progress.left()
            if left:
                raise ValueError(
                    f"the loaded state resumes epoch {current} with {left} row(s) of this rank "
                    f"not yet delivered; set_epoch({epoch}) would skip them. Iterate epoch "
                    f"{current} first, or build the loader without loading the state"
                )
            self._pending = False
        self._progress.reader.set_epoch(epoch)
        if epoch != current:  # another epoch has no earlier legs: whole shares again
            self._progress.refresh()

    def set_batch_size(self, batch_size: int) -> None:
        """Cut the next epochs' batches to ``batch_size`` rows (at most :attr:`message_rows`).

        The rows, their order and who reads them are unchanged: only where the main process
        cuts the workers' messages moves. A pass that needs no particular batch (an evaluation)
        can take whole messages and pay the per-batch cost less often. Between epochs only: a
        loaded mid-epoch state is resumed at the size it was loaded with.
        """
        if not 1 <= batch_size <= self.message_rows:
            raise ValueError(
                f"batch_size must be between 1 and the {self.message_rows} rows of a worker "
                f"message, got {batch_size}"
            )
        if self._pending:
            raise ValueError(
                "a loaded state waits to be resumed; iterate it before changing the batch size"
            )
        self.batch_size = batch_size

    def set_derive(self, derive: Derive | None) -> None:
        """Have the next epochs' batches hold ``derive``'s tensors in place of their columns.

        ``derive`` (:mod:`pipeline.readers.derive`) runs where the batch is read: in the worker
        processes, on each worker message, so the main process receives the tensors it would
        otherwise compute itself between steps. The batches keep the id, the ``lithi_*``
        columns and the rows' positions, so a pass is counted as before. ``None`` sends the
        columns again. Between epochs only; persistent workers (the map-style reader's) hold
        the function they were started with, so they are stopped here and the next epoch starts
        new ones. With ``fork`` workers the function is inherited; with ``spawn`` it must pickle.
        """
        if self._pending:
            raise ValueError(
                "a loaded state waits to be resumed; iterate it before changing what is derived"
            )
        wired = self.loader.dataset  # what the workers iterate
        assert isinstance(wired, _worker.WireMap | _worker.WireIterable)
        if wired.derive is derive:
            return
        wired.derive = derive
        self.stop_workers()

    def stop_workers(self) -> None:
        """Stop the worker processes still running between epochs (the map-style reader's are
        persistent); the next epoch starts new ones. Before another loader forks workers of its
        own: a process forked while these workers' queue threads run may inherit a held lock."""
        # torch keeps persistent workers in a private attribute and offers no public way to
        # stop them; reached defensively, like the result pipe (_worker._widen_result_pipe)
        running = getattr(self.loader, "_iterator", None)
        if running is not None and hasattr(running, "_shutdown_workers"):
            running._shutdown_workers()
            self.loader._iterator = None

    # -- iterating --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        if not self._pending:
            self._progress.reset()
        self._pending = False
        self._progress.begin()
        lifetime.note_fork_thread()
        inner = iter(self.loader)  # worker processes start here, with the resume point
        _worker._widen_result_pipe(inner)
        self._progress.started(self.loader.num_workers)
        return self._batches(inner)

    def _batches(self, inner: Iterator[tuple[int, Wire]]) -> Iterator[Batch]:
        for prefix, wire in inner:
            # finished here, in the main process: see Wire
            yield from self._deliver(prefix, wire_to_batch(wire))

    def _deliver(self, prefix: int, big: Batch) -> Iterator[Batch]:
        """One worker message's batch, cut into ``batch_size`` views and counted as they go."""
        if self.pin_memory:
            big = _pinned(big)  # once per message; the batches cut from it are views
        bs = self.batch_size
        n = _rows_of(big)
        if n > bs:
            _refuse_cutting_summaries(big, bs)
        for small in _cut(big, bs, n) if n > bs else (big,):
            # counted before it is handed over: a state taken while the training loop holds
            # this batch already includes it
            self._progress.advance(prefix, _rows_of(small))
            yield small

    def delivered_positions(self) -> np.ndarray:
        """Index positions this epoch has delivered so far, per :meth:`state_dict`'s ``rows``.

        After :meth:`load_state_dict`, these are the items the interrupted run had delivered
        before its checkpoint — what a resumed run counts as already seen when it reconciles
        the whole epoch (``index.ids.take(...)``). Computed from the state, the split and the
        Parquet footers only; no data is read.
        """
        return self._progress.delivered_positions()

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank's epoch stands, as small JSON-ready data: save it beside a checkpoint.

        ``rows`` is the number of rows delivered this epoch — an int (map-style: a prefix of
        the sampler's order) or one int per worker-owner (iterable: a prefix of each owner's
        stream) — next to ``epoch``, the parameters a resume must match (style, seed, shuffle,
        items and snapshot, and this rank's place: rank, world size, worker-owners) and the
        epoch's earlier ``legs`` if it was resumed at another shape. No ids, no tensors. To
        resume at another shape, merge every rank's state with
        :func:`~pipeline.readers.resume.merge_states`.
        """
        return {
            "version": STATE_VERSION,
            **self._progress.identity(),
            **self._progress.shape(),
            "epoch": self.epoch,
            "batch_size": self.batch_size,
            "legs": [leg.to_state() for leg in self._progress.legs],
            "rows": self._progress.state(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from ``state_dict``: call it before iterating.

        One rank's state (:meth:`state_dict`) resumes that rank at the same shape; a merged
        state (:func:`~pipeline.readers.resume.merge_states`) resumes on any ranks and workers.
        The next iteration yields the rest of the saved epoch — exactly the rows not delivered
        before the state was taken, each once across all ranks — skipping what was delivered
        without reading it (the iterable reader decodes at most the one row group holding a
        resume point again). A state of another split or bundle, or one rank's state at another
        shape, raises :class:`ResumeMismatch`. The batch size may differ; batch boundaries then
        follow the new size.
        """
        state = check_version(state_dict)
        differ = differences(state, self._progress.identity())
        merged = is_merged(state)
        if not merged:
            shape = differences(state, self._progress.shape())
            if shape and not differ:
                raise ResumeMismatch(
                    "the state is one rank's at another shape (" + "; ".join(shape) + "); "
                    "merge every rank's state with merge_states() to resume at another shape"
                )
            differ += shape
        if differ:
            raise ResumeMismatch(
                "the state belongs to another loader (build this one with the same split "
                "parameters on the same bundle): " + "; ".join(differ)
            )
        epoch = state.get("epoch")
        if not is_count(epoch):
            raise ValueError(f"loader state needs 'epoch' as an int >= 0, found {epoch!r}")
        reader, progress = self._progress.reader, self._progress
        legs = legs_from_state(state.get("legs"))
        reader.set_epoch(epoch)
        before = reader.legs
        reader.legs = legs
        try:
            progress.refresh()
            if not merged:
                progress.load(state.get("rows"))
        except ValueError:
            reader.legs = before
            progress.refresh()
            raise
        self._pending = True


def _pinned(batch: Batch) -> Batch:
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _rows_of(batch: Batch) -> int:
    for value in batch.values():
        if not isinstance(value, Summary):
            return len(value)
    raise ValueError("a batch holds no column, only summaries")


def _refuse_cutting_summaries(batch: Batch, size: int) -> None:
    summaries = [k for k, v in batch.items() if isinstance(v, Summary)]
    if summaries:
        raise ValueError(
            f"the derive summarised each worker message ({', '.join(map(repr, summaries))}), "
            f"which cannot be cut into batches of {size} rows; set_batch_size(message_rows) "
            "to hand over whole messages"
        )


def _cut(batch: Batch, size: int, n: int) -> Iterator[Batch]:
    """``batch`` (``n`` rows) as consecutive batches of ``size`` rows (views, not copies).

    ``torch.split`` makes all of a tensor's views in one call, cheaper than one ``narrow`` per
    batch and column, and that cost is the main process's (see docs/readers.md, "Cutting
    messages into batches").
    """
    columns = [
        torch.split(v, size)
        if isinstance(v, torch.Tensor)
        else [v[i : i + size] for i in range(0, n, size)]
        for v in batch.values()
    ]
    keys = list(batch)
    return (dict(zip(keys, values, strict=True)) for values in zip(*columns, strict=True))


def set_epoch(loader: ReaderLoader | DataLoader, epoch: int) -> None:
    """Tell a loader which epoch's order to produce (a :class:`ReaderLoader` or a DataLoader)."""
    if isinstance(loader, ReaderLoader):
        loader.set_epoch(epoch)
        return
    target = loader.sampler if isinstance(loader.sampler, OwnerSampler) else loader.dataset
    if not hasattr(target, "set_epoch"):
        raise TypeError(f"{type(target).__name__} has no set_epoch")
    target.set_epoch(epoch)
