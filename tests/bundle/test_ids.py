"""Duplicate ids are found exactly: hashing only narrows the search, it never decides."""

from __future__ import annotations

from collections import Counter
from unittest import mock

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from pipeline.bundle import ids
from pipeline.bundle.ids import duplicates, hash64

id_lists = st.lists(st.lists(st.text(max_size=20) | st.none(), max_size=30), max_size=4)


def expected(lists: list[list]) -> tuple[int, list[str]]:
    c = Counter(v for vals in lists for v in vals if v is not None)
    dups = sorted(v for v, n in c.items() if n > 1)
    return len(dups), dups[:5]


@given(lists=id_lists)
def test_matches_counting_in_python(lists):
    arrays = [pa.array(v, pa.string()) for v in lists]
    assert duplicates(arrays) == expected(lists)


@given(lists=id_lists)
def test_exact_even_when_every_hash_collides(lists):
    with mock.patch.object(ids, "hash64", lambda arr: np.zeros(len(arr), dtype=np.uint64)):
        assert duplicates([pa.array(v, pa.string()) for v in lists]) == expected(lists)


def test_equal_strings_hash_equal_across_offsets_and_chunks():
    a = pa.array(["x", "same-long-identifier-123", "y"])
    b = pa.array(["same-long-identifier-123"])
    assert hash64(a.slice(1, 1))[0] == hash64(b)[0] == hash64(a)[1]
    # Length is part of the hash: a trailing NUL byte is a different id.
    h = hash64(pa.array(["b", "b\x00", "", "\x00"]))
    assert len(set(h.tolist())) == 4


def test_chunked_and_dictionary_inputs():
    col = pa.chunked_array([["a", "b"], ["c", "a"]])
    assert duplicates([col]) == (1, ["a"])
    assert duplicates([pa.array(["q", "r", "q"]).dictionary_encode()]) == (1, ["q"])
    assert duplicates([]) == (0, [])


def test_hash_does_not_depend_on_the_other_values():
    alone = hash64(pa.array(["0"]))[0]
    assert hash64(pa.array(["0", "a-much-longer-neighbour"]))[0] == alone


def test_the_batches_of_one_array_hash_as_their_own_copies():
    """A table's batches are slices of its arrays (offsets into the parent's data): each hashes
    from its own bytes exactly as a fresh copy of it does."""
    ids = pa.array([f"id-{i:07d}" * (1 + i % 3) for i in range(10_000)])
    for batch in pa.table({"id": ids}).to_batches(max_chunksize=777):
        piece = batch.column(0)
        copy = pa.array(piece.to_pylist())
        assert (hash64(piece) == hash64(copy)).all()


def absent_in_python(expected_ids: list, found: list[list]) -> tuple[int, list[str]]:
    have = {v for vals in found for v in vals if v is not None}
    gone = [v for v in expected_ids if v is None or v not in have]
    return len(gone), gone[:5]


@given(
    expected_ids=st.lists(st.text(max_size=12) | st.none(), max_size=60),
    found=id_lists,
    cut=st.integers(0, 5),
)
def test_absent_matches_sets_in_python(expected_ids, found, cut):
    arrays = [pa.array(v, pa.string()) for v in found]
    if arrays and len(arrays[0]) > cut:  # a slice, as a table's batches are
        arrays[0] = arrays[0].slice(cut)
        found = [found[0][cut:], *found[1:]]
    assert ids.absent(pa.array(expected_ids, pa.string()), arrays) == absent_in_python(
        expected_ids, found
    )


@given(expected_ids=st.lists(st.text(max_size=6), max_size=40, unique=True), found=id_lists)
def test_absent_is_exact_when_ids_share_a_hash(expected_ids, found):
    """With a hash of four values nearly every id shares its hash with another: matching by
    hash alone would call present what is not; the strings decide."""
    weak = lambda arr: hash64(arr) % np.uint64(4)  # noqa: E731
    arrays = [pa.array(v, pa.string()) for v in found]
    with mock.patch.object(ids, "hash64", weak):
        got = ids.absent(pa.array(expected_ids, pa.string()), arrays)
    assert got == absent_in_python(expected_ids, found)


def test_absent_compares_slices_of_many_ids_at_a_time():
    many = pa.array([f"{i:07d}" for i in range(50_000)])
    found = [many.slice(0, 20_000), many.slice(20_001)]  # "0020000" never delivered
    with mock.patch.object(ids, "_COMPARE_ROWS", 4096):
        assert ids.absent(many, found) == (1, ["0020000"])
