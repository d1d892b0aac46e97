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
