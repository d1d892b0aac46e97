"""Reconcile what readers yielded with what the manifest promises, before anything is reported.

Each owner (a rank's main process, typically) keeps a :class:`Tally` of every batch it yielded;
:func:`reconcile` checks that the owners' counts sum to the manifest's items and its
accepted/failed/abstained counts and that no id was seen twice, and returns a
:class:`ReconcileReport`. A mismatch raises :class:`ReconcileError` naming the shortfall.

A reader's batch names each row's index position (``POSITION_KEY``), so a tally keeps positions,
eight bytes a row with no string copied, and reconciliation counts them per position; a batch
without positions (one built by hand) is tallied by its ids, kept as Arrow arrays, so millions
of them cost megabytes, not a Python set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import BundleError
from pipeline.bundle.ids import absent, duplicates, id_hashes
from pipeline.bundle.manifest import Manifest
from pipeline.readers.split import item_owners
from pipeline.readers.tensors import POSITION_KEY

_EXAMPLES = 5


class ReconcileError(BundleError):
    """What the readers yielded does not account for the manifest's items exactly once."""

    def __init__(self, message: str, report: ReconcileReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class OwnerCounts:
    """What one owner yielded: rows by status, and the rows seen as index positions (what a
    reader's batches name) or, for batches without them, as ids (Arrow string chunks)."""

    by_status: dict[str, int] = field(default_factory=dict)
    id_chunks: list[pa.Array] = field(default_factory=list)
    label: str = ""
    position_chunks: list[np.ndarray] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Rows yielded (the ids and positions counted)."""
        return sum(len(c) for c in self.id_chunks) + sum(len(c) for c in self.position_chunks)

    def ids(self) -> pa.ChunkedArray:
        """Every id tallied as a string, in order, as one chunked string array."""
        return pa.chunked_array(self.id_chunks, type=pa.string())

    def positions(self) -> np.ndarray:
        """Every index position tallied, in order, as one ``int64`` array."""
        if not self.position_chunks:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(self.position_chunks).astype(np.int64, copy=False)

    def __reduce__(self) -> tuple[Any, ...]:  # one compact array each for all_gather_object
        ids = [self.ids().combine_chunks()] if self.id_chunks else []
        positions = [self.positions()] if self.position_chunks else []
        return (OwnerCounts, (dict(self.by_status), ids, self.label, positions))


class Tally:
    """Count batches as they are yielded; call :meth:`update` before filtering a batch.

    With ``index_ids`` (the index's ids), each batch's first and last positions are checked
    against the ids it holds, so a reader naming the wrong rows fails at that batch.
    """

    def __init__(
        self,
        id_field: str,
        *,
        label: str = "",
        index_ids: pa.Array | pa.ChunkedArray | None = None,
    ) -> None:
        self.id_field = id_field
        self.counts = OwnerCounts(label=label)
        self._index_ids = index_ids

    def update(self, batch: dict) -> None:
        """Add one dict batch: its ids and, for result bundles, its ``lithi_status`` values."""
        ids = batch[self.id_field]
        if isinstance(ids, (str, bytes)):
            # pa.array("00042") would count five one-character ids
            raise TypeError(
                f"batch[{self.id_field!r}] is one {type(ids).__name__} ({ids!r:.40}), not a list "
                "of ids: this is a per-row sample, not a batch; collate rows with collate_batches"
            )
        positions = batch.get(POSITION_KEY)
        if positions is None:
            self.counts.id_chunks.append(pa.array(ids, type=pa.string()))
        else:
            pos = _positions(positions, len(ids))
            if self._index_ids is not None and len(pos):
                self._check_named(ids, pos)
            self.counts.position_chunks.append(pos)
        status = batch.get(fmt.STATUS_COLUMN)
        if status is not None:
            for value, n in _status_counts(status).items():
                key = str(value)
                self.counts.by_status[key] = self.counts.by_status.get(key, 0) + n

    def _check_named(self, ids: Any, pos: np.ndarray) -> None:
        assert self._index_ids is not None
        n = len(self._index_ids)
        for i in (0, len(pos) - 1):
            p = int(pos[i])
            held = self._index_ids[p].as_py() if 0 <= p < n else None
            if held != ids[i]:
                raise ValueError(
                    f"a batch names index position {p} for id {ids[i]!r}, where the index holds "
                    f"{held!r}: the reader's positions do not match its rows"
                )


def _status_counts(status: Any) -> dict[Any, int]:
    """Rows per ``lithi_status`` value of one batch (``None`` for a null). A batch's statuses
    are a list of a few distinct strings: counted in place, since building an Arrow array of
    them first costs more than the counting, on every batch of every pass."""
    if isinstance(status, list):
        return Counter(status)
    found, unknown = fmt.count_statuses(pa.array(status, type=pa.string()))
    return {value: n for value, n in [*found.items(), *unknown.items()] if n}


def _positions(value: Any, rows: int) -> np.ndarray:
    """A batch's positions as an ``int64`` array of their own (never a view that would keep a
    whole worker message alive), checked to name one position per row."""
    arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if arr.ndim != 1 or len(arr) != rows:
        raise ValueError(
            f"batch[{POSITION_KEY!r}] holds {arr.shape} positions for {rows} rows; "
            "one position per row"
        )
    return np.array(arr, dtype=np.int64, copy=True)


@dataclass(frozen=True)
class ReconcileReport:
    """The figures a run reports: expected vs iterated, by status, outstanding, dup/missing."""

    items_expected: int
    items_iterated: int
    by_status_expected: dict[str, int]
    by_status_found: dict[str, int]
    outstanding: int
    duplicates: int
    duplicate_examples: list[str]
    missing: int | None
    missing_examples: list[str]
    owners: int

    @property
    def ok(self) -> bool:
        """Whether every item was yielded exactly once and the statuses add up."""
        return (
            self.items_iterated == self.items_expected
            and self.duplicates == 0
            and not self.missing
            and self.by_status_found == self.by_status_expected
        )

    def problems(self) -> list[str]:
        """Each shortfall in words (empty when :attr:`ok`)."""
        out = []
        if self.items_iterated != self.items_expected:
            diff = self.items_expected - self.items_iterated
            word = "short by" if diff > 0 else "over by"
            out.append(
                f"items expected {self.items_expected} (manifest), iterated "
                f"{self.items_iterated} across {self.owners} owner(s): {word} {abs(diff)}"
            )
        if self.duplicates:
            out.append(
                f"{self.duplicates} id(s) yielded more than once, e.g. {self.duplicate_examples}"
            )
        if self.missing:
            out.append(f"{self.missing} id(s) never yielded, e.g. {self.missing_examples}")
        for s in sorted(set(self.by_status_expected) | set(self.by_status_found)):
            e, f = self.by_status_expected.get(s, 0), self.by_status_found.get(s, 0)
            if e != f:
                out.append(f"{s}: expected {e} (manifest), found {f}")
        return out

    def as_dict(self) -> dict:
        """Plain data for metadata and experiment records."""
        return {**self.__dict__, "ok": self.ok}


def reconcile(
    manifest: Manifest,
    counts: Sequence[OwnerCounts],
    *,
    ids: pa.Array | pa.ChunkedArray | None = None,
    raise_on_mismatch: bool = True,
) -> ReconcileReport:
    """Check the owners' counts against ``manifest``; raise :class:`ReconcileError` on any gap.

    Pass the index's ``ids`` to also name missing ids; without them missing ones are still
    caught through the count (every yielded id is unique and the total must match).
    """
    if not isinstance(manifest, Manifest):
        raise TypeError(f"reconcile needs a Manifest, found {type(manifest).__name__}")
    found_status: dict[str, int] = {}
    for oc in counts:
        for s, n in oc.by_status.items():
            found_status[s] = found_status.get(s, 0) + n
    result = manifest.kind == "result"
    expected_status = dict(manifest.counts.by_status) if result else {}
    if result:
        for s in fmt.STATUSES:
            found_status.setdefault(s, 0)
    if any(oc.id_chunks for oc in counts) or not any(oc.position_chunks for oc in counts):
        iterated, dups, dup_examples, missing, missing_examples = _by_ids(counts, ids)
    else:
        iterated, dups, dup_examples, missing, missing_examples = _by_positions(
            counts, manifest.counts.items, ids
        )
    report = ReconcileReport(
        items_expected=manifest.counts.items,
        items_iterated=iterated,
        by_status_expected=expected_status,
        by_status_found=found_status,
        outstanding=manifest.counts.outstanding or 0,
        duplicates=dups,
        duplicate_examples=dup_examples,
        missing=missing,
        missing_examples=missing_examples,
        owners=len(counts),
    )
    if raise_on_mismatch and not report.ok:
        raise ReconcileError(
            f"reconcile failed for snapshot {manifest.snapshot.version_id}: "
            + "; ".join(report.problems()),
            report,
        )
    return report


_Found = tuple[int, int, list[str], "int | None", list[str]]


def _by_ids(counts: Sequence[OwnerCounts], ids: pa.Array | pa.ChunkedArray | None) -> _Found:
    """Rows, duplicated ids and missing ids, from tallied ids (positions are named by ``ids``)."""
    chunks = [c for oc in counts for c in oc.id_chunks]
    if any(oc.position_chunks for oc in counts):
        if ids is None:
            raise ValueError("owners tallied index positions: reconcile needs the index's ids")
        chunks += [ids.take(pa.array(oc.positions())) for oc in counts if oc.position_chunks]
        chunks = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in chunks]
    seen = pa.chunked_array(chunks, type=pa.string())
    # hashed once, for the duplicates and the missing; never a hash table of the strings
    found = id_hashes(chunks)
    dups, dup_examples = duplicates([seen], limit=_EXAMPLES, hashes=[found])
    missing: int | None = None
    missing_examples: list[str] = []
    if ids is not None:
        missing, missing_examples = absent(ids, chunks, _EXAMPLES, found_hashes=found)
    return len(seen), dups, dup_examples, missing, missing_examples


def _by_positions(
    counts: Sequence[OwnerCounts], items: int, ids: pa.Array | pa.ChunkedArray | None
) -> _Found:
    """Rows, duplicated and missing items, from tallied index positions: a count per position.

    A position outside the index names no item; it is a row iterated that no count of an
    item holds, so the totals show it.
    """
    pos = np.concatenate([oc.positions() for oc in counts])
    owners = item_owners(pos, items)

    def named(where: np.ndarray) -> list[str]:
        if ids is None:
            return [f"index position {int(p)}" for p in where[:_EXAMPLES]]
        return sorted(ids.take(pa.array(where[:_EXAMPLES])).to_pylist())

    repeated, unowned = owners.repeated, owners.unowned
    return len(pos), len(repeated), named(repeated), len(unowned), named(unowned)


def reconcile_distributed(
    manifest: Manifest,
    local_counts: OwnerCounts,
    group: dist.ProcessGroup | None = None,
    *,
    ids: pa.Array | pa.ChunkedArray | None = None,
    raise_on_mismatch: bool = True,
) -> ReconcileReport:
    """Gather every rank's counts (``all_gather_object``) and reconcile them on every rank.

    A collective: every rank in ``group`` must call it. Each rank gets the same report (and
    the same error), so no rank reports success while another found a gap.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return reconcile(manifest, [local_counts], ids=ids, raise_on_mismatch=raise_on_mismatch)
    gathered: list[OwnerCounts | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, local_counts, group=group)
    return reconcile(
        manifest,
        [c for c in gathered if c is not None],
        ids=ids,
        raise_on_mismatch=raise_on_mismatch,
    )


@dataclass(frozen=True)
class KeyedCoverage:
    """How a table keyed by item id covers an index: one row per item, or what is off."""

    rows: int
    items: int
    duplicates: int
    duplicate_examples: list[str]
    missing: int
    missing_examples: list[str]
    extra: int
    extra_examples: list[str]

    @property
    def ok(self) -> bool:
        """Exactly one row per item of the index, and no row for anything else."""
        return not (self.duplicates or self.missing or self.extra)

    def problems(self) -> list[str]:
        """Each gap in words (empty when :attr:`ok`)."""
        out = []
        if self.missing:
            out.append(f"{self.missing} item(s) have no row, e.g. {self.missing_examples}")
        if self.extra:
            out.append(f"{self.extra} row(s) name no item of the index, e.g. {self.extra_examples}")
        if self.duplicates:
            out.append(f"{self.duplicates} id(s) have several rows, e.g. {self.duplicate_examples}")
        return out


def keyed_coverage(
    index_ids: pa.Array | pa.ChunkedArray, table_ids: pa.Array | pa.ChunkedArray
) -> KeyedCoverage:
    """Compare a table's id column with the index's ids: duplicates, missing and extra ids."""
    table_chunks = table_ids.chunks if isinstance(table_ids, pa.ChunkedArray) else [table_ids]
    table_all = pa.chunked_array(table_chunks, type=pa.string()).combine_chunks()
    index_all = (
        index_ids.combine_chunks() if isinstance(index_ids, pa.ChunkedArray) else index_ids
    ).cast(pa.string())
    table_hashes = id_hashes(table_all)
    dups, dup_examples = duplicates([table_all], limit=_EXAMPLES, hashes=[table_hashes])
    missing, missing_examples = absent(index_all, [table_all], _EXAMPLES, found_hashes=table_hashes)
    extra, extra_examples = absent(table_all, [index_all], _EXAMPLES)
    return KeyedCoverage(
        rows=len(table_all),
        items=len(index_all),
        duplicates=dups,
        duplicate_examples=dup_examples,
        missing=missing,
        missing_examples=missing_examples,
        extra=extra,
        extra_examples=extra_examples,
    )
