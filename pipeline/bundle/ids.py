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


#: Ids hashed per block: the rounds' temporaries (a few int64 arrays) stay tens of MiB.
_HASH_ROWS = 1 << 20


def hash64(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of every value of a string array (nulls hash as the empty string)."""
    if isinstance(arr, pa.ChunkedArray):  # chunk by chunk: no combined copy of the strings
        out = np.empty(len(arr), dtype=np.uint64)
        done = 0
        for chunk in arr.chunks:
            out[done : done + len(chunk)] = hash64(chunk)
            done += len(chunk)
        return out
    arr = arr.cast(pa.string()) if arr.type != pa.string() else arr
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    if n > _HASH_ROWS:
        out = np.empty(n, dtype=np.uint64)
        for a in range(0, n, _HASH_ROWS):
            out[a : a + _HASH_ROWS] = _hash_block(arr.slice(a, _HASH_ROWS))
        return out
    return _hash_block(arr)


def _hash_block(arr: pa.Array) -> np.ndarray:
    n = len(arr)
    off = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    # A slice's offsets point into its parent's data: copy only the slice's own bytes, so
    # hashing the batches of one large array costs their size, not the array's size each.
    base = int(off[0])
    starts = off[:-1].astype(np.int64) - base
    lens = (off[1:] - off[:-1]).astype(np.int64)
    data_buf = arr.buffers()[2]
    end = int(off[-1]) - base
    padded = np.zeros(end + 8, dtype=np.uint8)  # so an 8-byte read at any start stays inside
    if data_buf is not None and end:
        padded[:end] = np.frombuffer(data_buf, dtype=np.uint8, count=end, offset=base)
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


def id_hashes(ids: pa.Array | pa.ChunkedArray | list[pa.Array]) -> np.ndarray:
    """The hashes :func:`duplicates` and :func:`absent` need for one column (or a list of
    arrays: a pass's batches), in one array filled chunk by chunk (no list of pieces beside it
    to concatenate); computable in a worker thread."""
    chunks = _string_chunks(ids if isinstance(ids, list) else [ids])
    return hash64(pa.chunked_array(chunks, type=pa.string()))


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
    # Sorted where it was concatenated: a second array of every hash costs more to allocate
    # than to fill on a machine that backs large arrays with huge pages (docs/performance.md).
    order = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    order.sort()
    clash = order[1:] == order[:-1]
    if not clash.any():
        return 0, []
    # Exact check, in Arrow, of only the ids whose hashes collide.
    suspects = np.unique(order[1:][clash])
    del order, clash
    mask = pa.array(np.isin(np.concatenate(hashes), suspects))
    candidates = pc.filter(pa.chunked_array(chunks, type=pa.string()), mask)
    counts = pc.value_counts(candidates)
    dups = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
    examples = sorted(dups.to_pylist())[:limit] if len(dups) <= 10_000 else dups[:limit].to_pylist()
    return len(dups), examples


#: Ids compared as strings at a time in :func:`absent`: its temporaries stay megabytes.
_COMPARE_ROWS = 1 << 20


def absent(
    expected: pa.Array | pa.ChunkedArray,
    found: list[pa.Array | pa.ChunkedArray],
    limit: int = 5,
    *,
    found_hashes: np.ndarray | None = None,
) -> tuple[int, list[str]]:
    """Count the values of ``expected`` (an index's ids, say; a null counts as absent) that no
    array of ``found`` holds; return ``(count, up to `limit` examples in expected's order)``.

    Exact, and without a hash table of strings (``pc.is_in`` over ten million ids builds one
    of several hundred MiB): ``expected``'s hashes are sorted, each found id is matched by its
    hash to the expected id with that hash, and the pair is then compared as strings, a slice
    of ids at a time. An expected id whose hash another expected id shares (a 64-bit collision)
    is checked with Arrow's ``is_in`` against the few found ids that carry that hash.
    ``found_hashes``, if given, are ``id_hashes`` of ``found`` concatenated (already computed
    by :func:`duplicates`, say).
    """
    exp = expected.combine_chunks() if isinstance(expected, pa.ChunkedArray) else expected
    exp = exp.cast(pa.string()) if exp.type != pa.string() else exp
    n = len(exp)
    if n == 0:
        return 0, []
    chunks = _string_chunks(found)
    if found_hashes is None:
        found_hashes = id_hashes(chunks)
    hashes = hash64(exp)
    order = np.argsort(hashes, kind="stable")  # order[i]: the expected position of slot i
    hashes.sort()  # in place: the same values order[] gives, without a second copy
    shared = np.zeros(n, dtype=np.bool_)  # sorted slots whose hash two expected ids share
    same = hashes[1:] == hashes[:-1]
    shared[1:] |= same
    shared[:-1] |= same
    covered = np.zeros(n, dtype=np.bool_)  # by expected position
    # Each found id's slot among the sorted expected hashes, looked up in sorted order (a
    # search of sorted queries walks memory forward; random ones miss the cache every time).
    by_hash = np.argsort(found_hashes)
    slots = np.empty(len(found_hashes), dtype=np.int64)
    for a in range(0, len(by_hash), _HASH_ROWS):
        block = by_hash[a : a + _HASH_ROWS]
        slots[block] = np.searchsorted(hashes, found_hashes[block])
    del by_hash
    np.minimum(slots, n - 1, out=slots)
    every = pa.chunked_array(chunks, type=pa.string())
    # A window of found ids at a time, made contiguous: a take on a chunked array of many
    # batches would concatenate every batch for each call.
    for a in range(0, len(every), _COMPARE_ROWS):
        window_slots = slots[a : a + _COMPARE_ROWS]
        hit = (hashes[window_slots] == found_hashes[a : a + _COMPARE_ROWS]) & ~shared[window_slots]
        rows = np.flatnonzero(hit)
        if not len(rows):
            continue
        window = every.slice(a, _COMPARE_ROWS).combine_chunks()
        positions = order[window_slots[rows]]
        equal = pc.equal(window.take(pa.array(rows)), exp.take(pa.array(positions)))
        covered[positions[pc.fill_null(equal, False).to_numpy(zero_copy_only=False)]] = True
    if shared.any():  # the rare expected ids that share a hash: compared exactly, in Arrow
        suspects = np.unique(hashes[shared])
        mine = order[shared]
        theirs = pc.filter(
            pa.chunked_array(chunks, type=pa.string()), pa.array(np.isin(found_hashes, suspects))
        )
        present = pc.is_in(exp.take(pa.array(mine)), value_set=theirs.combine_chunks())
        covered[mine[pc.fill_null(present, False).to_numpy(zero_copy_only=False)]] = True
    missing = np.flatnonzero(~covered)
    return len(missing), exp.take(pa.array(missing[:limit])).to_pylist()
