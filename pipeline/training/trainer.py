"""The trainer interface: your own training code, run by the pipeline over a verified index.

A trainer is a class with ``fit`` and ``predict`` (subclass :class:`Trainer`), chosen by import
path (``my_pkg.train:MyTrainer``). The pipeline owns everything around it, so no trainer can get
it wrong: it verifies the data and builds the :class:`~pipeline.readers.Index`, decides the
owner's rank and world size, hands ``fit`` a loader factory whose every pass is tallied, hashes
the files ``fit`` wrote as the checkpoint, writes the record (snapshot identity, index digest,
trainer path and version, config, declared features), reconciles what the readers yielded
against the manifest, checks that ``predict`` returned one row per item, and stages the
predictions. The same class runs in-process (``world_size`` 1) and on every ``torchrun`` rank.

A minimal trainer::

    class MyTrainer(Trainer):
        class Config(pydantic.BaseModel):     # optional: becomes the Dagster run config
            epochs: int = 3

        def fit(self, ctx: FitContext) -> FitResult:
            model = MyNet().to(ctx.device)        # cuda:LOCAL_RANK on a GPU machine, else cpu
            loader = ctx.loader(batch_size=256)   # this rank's disjoint share (pinned on a GPU)
            for epoch in range(ctx.config.epochs):
                loader.set_epoch(epoch)
                for batch in loader:              # dict batches, ids as str
                    batch = ctx.to_device(batch)  # tensors moved, ids still str
                    ...
            torch.save(cpu_state_dict(model), ctx.output_dir / "model.pt")
            return FitResult(metrics={...}, features=FeatureSet(used=["x"]))

        def predict(self, ctx: PredictContext) -> pa.Table:
            ...                                   # one row per item, keyed by ctx.index.id_field
                                                  # (or a pa.RecordBatchReader, streamed)

Nothing here imports Dagster.
"""

from __future__ import annotations

import abc
import hashlib
import importlib.metadata
import inspect
import pkgutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.bundle.errors import one_line
from pipeline.bundle.manifest import Schema
from pipeline.readers.derive import Derive
from pipeline.readers.index import Index
from pipeline.readers.loader import make_loader, set_epoch
from pipeline.readers.reconcile import OwnerCounts, Tally
from pipeline.readers.resume import merge_states
from pipeline.training.device import to_device, wants_pinned_memory
from pipeline.training.progress import Progress

#: The trainer the pipeline uses unless ``LITHI_TRAINER`` or the run config names another.
REFERENCE_TRAINER = "pipeline.training.reference:ReferenceTrainer"


class TrainerError(ValueError):
    """A trainer cannot be loaded, is not a :class:`Trainer`, or refuses its config or data."""


class FeatureSet(BaseModel):
    """The features a trainer declares it used, the columns it left out with the reason, and
    what it did with missing values (when it says)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    used: list[str]
    dropped: dict[str, str] = {}
    #: what a row missing a feature value got: ``fill``, ``drop`` or ``refuse``; None: not said
    missing: Literal["fill", "drop", "refuse"] | None = None
    #: values missing (null, or NaN in a float) and filled, per feature, among the rows the fit
    #: used
    filled: dict[str, int] = {}
    #: rows the fit left out for a missing feature value (``missing`` is ``drop``)
    rows_dropped: int = 0


@dataclass(frozen=True)
class FitResult:
    """What ``fit`` reports back: metrics, a loss curve if it has one, the features it used."""

    metrics: dict[str, float] = field(default_factory=dict)
    loss_curve: list[float] = field(default_factory=list)
    features: FeatureSet = field(default_factory=lambda: FeatureSet(used=[]))


@dataclass
class PassLog:
    """Every pass a trainer made over its loaders: the last complete one's counts, and totals.

    ``resumed`` is the last complete pass that began in an earlier process (resumed from a
    mid-fit cut): its counts hold what was delivered before the cut and after it, so the
    pipeline can reconcile the interrupted pass as one.
    """

    started: int = 0
    completed: int = 0
    last: OwnerCounts | None = None
    resumed: OwnerCounts | None = None


class TalliedLoader:
    """A loader from :func:`~pipeline.readers.make_loader` whose every full pass is counted.

    Iterating it yields the loader's batches unchanged; a pass that runs to the end is recorded
    for the pipeline's reconciliation, so a trainer never counts anything itself. Its
    :meth:`state_dict` is the loader's (positions, no ids) plus the pass's counts by status, so
    a pass resumed from a mid-fit cut is still counted whole.
    """

    def __init__(self, loader: Any, index: Index, log: PassLog, label: str) -> None:
        self.loader = loader
        self._index = index
        self._log = log
        self._label = label
        self._tally: Tally | None = None  # the pass in progress
        self._resume: Tally | None = None  # what a loaded state had delivered before its cut

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's order (ownership never changes with it)."""
        set_epoch(self.loader, epoch)

    def set_batch_size(self, batch_size: int) -> None:
        """Cut the next passes' batches to ``batch_size`` rows (see
        :meth:`~pipeline.readers.loader.ReaderLoader.set_batch_size`)."""
        self.loader.set_batch_size(batch_size)

    def set_derive(self, derive: Derive | None) -> None:
        """Compute ``derive``'s tensors where the batches are read (see
        :meth:`~pipeline.readers.loader.ReaderLoader.set_derive`)."""
        self.loader.set_derive(derive)

    def stop_workers(self) -> None:
        """Stop the worker processes left running between passes (see
        :meth:`~pipeline.readers.loader.ReaderLoader.stop_workers`)."""
        self.loader.stop_workers()

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict]:
        resumed, self._resume = self._resume, None
        tally = resumed or self._new_tally()
        self._tally = tally
        if resumed is None:
            self._log.started += 1
        for batch in self.loader:
            tally.update(batch)
            yield batch
        self._tally = None
        self._log.completed += 1
        self._log.last = tally.counts
        if resumed is not None:
            self._log.resumed = tally.counts

    def _new_tally(self) -> Tally:
        return Tally(self._index.id_field, label=self._label, index_ids=self._index.ids)

    def state_dict(self) -> dict[str, Any]:
        """Where this pass stands: the loader's state and the statuses counted so far.

        Take it between batches (after the trainer has used the last one it got); save it in a
        mid-fit cut (:class:`~pipeline.training.progress.Progress`). Small: no ids.
        """
        by_status = dict(self._tally.counts.by_status) if self._tally is not None else {}
        return {
            "loader": self.loader.state_dict(),
            "by_status": by_status,
            "passes": {"started": self._log.started, "completed": self._log.completed},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next pass yields the rest of the saved one.

        The rows delivered before the cut are the loader's delivered positions (computed from
        the state, nothing read), so the resumed pass reconciles as one whole pass: none twice,
        none lost.
        """
        self.loader.load_state_dict(state["loader"])
        tally = self._new_tally()
        tally.counts.position_chunks.append(self.loader.delivered_positions())
        tally.counts.by_status.update({str(k): int(v) for k, v in state["by_status"].items()})
        self._resume = tally
        passes = state.get("passes", {})
        self._log.started = int(passes.get("started", self._log.started))
        self._log.completed = int(passes.get("completed", self._log.completed))


def merge_tallied_states(states: Sequence[Mapping[str, Any]], *, rank: int) -> dict[str, Any]:
    """Every old rank's :meth:`TalliedLoader.state_dict`, as one state rank ``rank`` of any
    new shape loads: the loader states merged (:func:`~pipeline.readers.merge_states`) and the
    statuses counted so far given to rank 0 alone, so the resumed pass still reconciles once."""
    by_status: dict[str, int] = {}
    if rank == 0:
        for state in states:
            for k, v in state["by_status"].items():
                by_status[str(k)] = by_status.get(str(k), 0) + int(v)
    return {
        "loader": merge_states([s["loader"] for s in states]),
        "by_status": by_status,
        "passes": dict(states[0].get("passes", {})),
    }


class _Context:
    """What every trainer call gets: the verified index, its config, a log, readers, a device.

    :attr:`device` is where this rank computes (``cuda:LOCAL_RANK`` on a GPU machine, else the
    CPU; see :func:`~pipeline.training.device.choose_device`). Put the model there, move each
    batch with :meth:`to_device`, and save checkpoints from CPU tensors
    (:func:`~pipeline.training.device.cpu_state_dict`) so their digest names the weights, not
    the hardware.
    """

    def __init__(
        self,
        *,
        index: Index,
        config: Any,
        rank: int,
        world_size: int,
        num_workers: int,
        log: Callable[[str], None],
        device: torch.device | str = "cpu",
    ) -> None:
        self.index = index
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.num_workers = num_workers
        self.log = log
        self.device = torch.device(device)
        self.passes = PassLog()

    def to_device(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch``'s tensors on :attr:`device` (non-blocking); ids and strings stay lists."""
        return to_device(batch, self.device)

    def loader(
        self,
        *,
        style: Literal["map", "iterable"] = "map",
        batch_size: int = 256,
        shuffle: bool = True,
        mix: bool = False,
        seed: int = 0,
        columns: list[str] | None = None,
        num_workers: int | None = None,
    ) -> TalliedLoader:
        """A DataLoader over this owner's disjoint share of the index, each pass counted.

        ``num_workers`` defaults to the pipeline's setting (``LITHI_NUM_WORKERS``). Batches are
        pinned when :attr:`device` is a GPU, so :meth:`to_device` copies them asynchronously.
        ``mix`` (with ``shuffle``) gives every rank a share of every part each epoch and mixes
        parts within batches (:mod:`pipeline.readers.mix`).
        Every item of the index reaches exactly one rank; a full pass over every rank's loader
        covers the manifest's items exactly once, which is what the pipeline checks afterwards.
        """
        inner = make_loader(
            self.index,
            style=style,
            batch_size=batch_size,
            num_workers=self.num_workers if num_workers is None else num_workers,
            columns=columns,
            shuffle=shuffle,
            mix=mix,
            seed=seed,
            rank=self.rank,
            world_size=self.world_size,
            pin_memory=wants_pinned_memory(self.device),
        )
        return TalliedLoader(inner, self.index, self.passes, f"rank {self.rank}")


class FitContext(_Context):
    """``fit``'s arguments: index, rank and world size, config, output directory, log, loader.

    Write the checkpoint into :attr:`output_dir` (rank 0 writes; under torchrun every rank
    gets the same directory). Everything found there after ``fit`` returns is the checkpoint:
    the pipeline hashes it, records it, and hands it to ``predict``.

    :attr:`progress` is where a long fit saves mid-fit cuts (model, optimizer, each loader's
    :meth:`TalliedLoader.state_dict`) every ``progress.every`` steps and, when the pipeline
    restarts a killed fit, finds the last one (:meth:`~pipeline.training.progress.Progress.load`).
    A trainer that never saves simply starts over.
    """

    def __init__(self, *, output_dir: Path, progress: Progress | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.output_dir = Path(output_dir)
        self.progress = progress or Progress(None, rank=self.rank, world_size=self.world_size)


class PredictContext(_Context):
    """``predict``'s arguments: the index, the config, the checkpoint directory and its digest.

    ``predict`` may put what a person should know about its predictions in :attr:`metadata`
    (counts of values it filled or never saw in training, say): the pipeline shows it beside
    the prediction table.
    """

    def __init__(self, *, checkpoint_dir: Path, checkpoint_sha256: str, **kw: Any) -> None:
        super().__init__(rank=0, world_size=1, **kw)
        self.checkpoint_dir = Path(checkpoint_dir)
        self.checkpoint_sha256 = checkpoint_sha256
        self.metadata: dict[str, int | float | str] = {}


class Trainer(abc.ABC):
    """Subclass this, implement :meth:`fit` and :meth:`predict`; set ``Config`` to type your
    config (a pydantic model: the pipeline validates the run config with it, and Dagster shows
    its fields), and ``version`` to say which version of your code trained a checkpoint."""

    Config: ClassVar[type[BaseModel] | None] = None
    version: ClassVar[str | None] = None

    @abc.abstractmethod
    def fit(self, ctx: FitContext) -> FitResult:
        """Train on ``ctx.loader(...)`` batches and write the checkpoint into ``ctx.output_dir``."""

    @abc.abstractmethod
    def predict(self, ctx: PredictContext) -> pa.Table | pa.RecordBatchReader:
        """Return one row per item of ``ctx.index``, keyed by its string id column: a table, or
        a ``pa.RecordBatchReader`` for a table too large to hold (the pipeline writes the
        batches in row groups as they come; fill ``ctx.metadata`` by the stream's end)."""

    def check(self, config: Any, schema: Schema, id_field: str) -> None:  # noqa: B027 (optional)
        """Refuse a config that cannot work on a bundle declaring ``schema``, before any work.

        The pipeline calls it before training starts (on the manifest's schema, nothing read),
        so a column that is missing or of the wrong type stops the run at once: raise one
        :class:`TrainerError` line naming the column, its type and what would work. The
        default accepts everything.
        """

    def parse_config(self, config: Mapping[str, Any] | BaseModel | None) -> Any:
        """The config as ``fit``/``predict`` receive it: a ``Config`` instance, or a dict."""
        data = config.model_dump() if isinstance(config, BaseModel) else dict(config or {})
        if self.Config is None:
            return data
        try:
            return self.Config.model_validate(data)
        except ValidationError as e:
            problems = one_line(e, root="<config>")
            raise TrainerError(f"{type(self).__name__} config: {problems}") from None


class TrainerInfo(BaseModel):
    """Which code trained a checkpoint: import path, declared version, source digest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    version: str | None = None
    source_sha256: str | None = None


def load_trainer(path: str) -> Trainer:
    """Import ``package.module:Name`` and return a :class:`Trainer` instance.

    ``Name`` is a :class:`Trainer` subclass (instantiated with no arguments) or an instance.
    Every failure is one :class:`TrainerError` line naming the path and what is wrong.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise TrainerError(f"trainer {path!r}: expected 'package.module:ClassName'")
    try:
        obj = pkgutil.resolve_name(path)
    except ImportError as e:
        raise TrainerError(f"trainer {path!r}: cannot import {module_name!r} ({e})") from None
    except AttributeError:
        raise TrainerError(f"trainer {path!r}: module {module_name!r} has no {attr!r}") from None
    if inspect.isclass(obj) and issubclass(obj, Trainer):
        return obj()
    if isinstance(obj, Trainer):
        return obj
    raise TrainerError(
        f"trainer {path!r}: {attr!r} is {type(obj).__name__}, not a subclass of "
        "pipeline.training.Trainer (implement fit and predict)"
    )


def trainer_info(path: str, trainer: Trainer) -> TrainerInfo:
    """The record entry for ``trainer`` loaded from ``path``."""
    version = type(trainer).version
    if version is None:  # the version of the distribution that ships the trainer's package
        top = path.partition(":")[0].split(".")[0]
        for dist in importlib.metadata.packages_distributions().get(top, []):
            version = importlib.metadata.version(dist)
            break
    source = inspect.getsourcefile(type(trainer))
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest() if source else None
    return TrainerInfo(path=path, version=version, source_sha256=digest)
