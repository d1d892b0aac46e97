"""Exact duplicate detection for millions of string ids, without a hash table of strings.

Each id is reduced to a 64-bit hash with vectorised numpy over the Arrow buffers, the hashes are
sorted, and only ids whose hashes collide are compared exactly (with Arrow). Equal strings always
hash equally, so nothing is missed; a collision between different strings only costs the exact
comparison of those few ids. Hashing runs per part in threads while ``verify`` reads them.
``bench/ids.py`` measures it against ``pc.value_counts`` and ``Table.group_by`` (see
``docs/bundle-format.md``); it is the one routine for the question, used by verification,
reconciliation and the one-row-per-item check.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_M0 = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# _MASKS[k] keeps the low k bytes of a little-endian word (k = 0..8).
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)


def hash64(arr: pa.Array) -> np.ndarray:
    """A 64-bit hash of every value of a string array (nulls hash as the empty string)."""
    arr = arr.cast(pa.string()) if arr.type != pa.string() else arr
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    off = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    starts = off[:-1].astype(np.int64)
    lens = (off[1:] - off[:-1]).astype(np.int64)
    data_buf = arr.buffers()[2]
    end = int(off[-1])
    padded = np.zeros(end + 8, dtype=np.uint8)  # so an 8-byte read at any start stays inside
    if data_buf is not None and end:
        padded[:end] = np.frombuffer(data_buf, dtype=np.uint8, count=end)
    # Every byte offset read as a little-endian uint64 (an overlapping, 1-byte-stride view).
    words = np.ndarray(shape=(end + 1,), dtype="<u8", buffer=padded, strides=(1,))
    h = lens.astype(np.uint64) * _M0
    longest = int(lens.max())
    with np.errstate(over="ignore"):
        for j in range(0, longest, 8):
            rem = np.clip(lens - j, 0, 8)
            w = words[np.minimum(starts + j, end)] & _MASKS[rem]
            mixed = (h ^ w) * _M1
            mixed ^= mixed >> np.uint64(29)
            # Only ids that still have bytes take this round: a hash never depends on its
            # neighbours' lengths.
            h = np.where(rem > 0, mixed, h)
        h = (h ^ (h >> np.uint64(32))) * _M2
    return h ^ (h >> np.uint64(29))


def _string_chunks(arrays: list[pa.Array | pa.ChunkedArray]) -> list[pa.Array]:
    """Non-empty plain-string chunks with nulls dropped (nulls are reported elsewhere)."""
    chunks = [
        c for a in arrays for c in (a.chunks if isinstance(a, pa.ChunkedArray) else [a]) if len(c)
    ]
    chunks = [c.cast(pa.string()) if c.type != pa.string() else c for c in chunks]
    return [c.drop_null() if c.null_count else c for c in chunks]


def id_hashes(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The hashes :func:`duplicates` needs for one column; computable in a worker thread."""
    chunks = _string_chunks([ids])
    if not chunks:
        return np.zeros(0, dtype=np.uint64)
    return np.concatenate([hash64(c) for c in chunks])


def duplicates(
    arrays: list[pa.Array | pa.ChunkedArray],
    limit: int = 5,
    *,
    hashes: list[np.ndarray] | None = None,
) -> tuple[int, list[str]]:
    """Count the distinct values that occur more than once across ``arrays`` (nulls ignored).

    Returns ``(number of duplicated values, up to `limit` examples)``. ``hashes``, if given,
    are :func:`id_hashes` of each array, computed earlier (e.g. in parallel).
    """
    chunks = _string_chunks(arrays)
    if not chunks:
        return 0, []
    if hashes is None:
        hashes = [id_hashes(a) for a in arrays]
    all_hashes = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    order = np.sort(all_hashes)
    clash = order[1:] == order[:-1]
    if not clash.any():
        return 0, []
    # Exact check, in Arrow, of only the ids whose hashes collide.
    suspects = np.unique(order[1:][clash])
    mask = pa.array(np.isin(all_hashes, suspects))
    candidates = pc.filter(pa.chunked_array(chunks, type=pa.string()), mask)
    counts = pc.value_counts(candidates)
    dups = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
    examples = sorted(dups.to_pylist())[:limit] if len(dups) <= 10_000 else dups[:limit].to_pylist()
    return len(dups), examples
