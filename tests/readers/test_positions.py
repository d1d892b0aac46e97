"""Every batch carries its rows' index positions, and they name the rows it holds.

Hold-out membership and the pipeline's tally are looked up by these positions instead of
hashing or copying ids, so a position that names another row would mislabel a row or hide a
duplicate: each reader, shuffled or not, mixed or not, fresh or resumed, is checked against the
index's own ids.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.readers import MapDataset, make_loader, set_epoch
from pipeline.readers.tensors import POSITION_KEY, UnreadableType, check_readable
from tests.helpers.readers import uneven_index


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return uneven_index(tmp_path_factory.mktemp("positions"))


def _check(index, batches) -> np.ndarray:
    """Every batch's positions name its ids; the positions of the whole pass, in order."""
    seen = []
    for b in batches:
        pos = b[POSITION_KEY]
        assert isinstance(pos, torch.Tensor) and pos.dtype == torch.int64
        assert len(pos) == len(b[index.id_field])
        named = index.ids.take(pa.array(pos.numpy())).to_pylist()
        assert named == list(b[index.id_field])
        seen.append(pos.numpy())
    return np.concatenate(seen)


@pytest.mark.parametrize("style", ["map", "iterable"])
@pytest.mark.parametrize(
    ("shuffle", "mix", "workers"), [(False, False, 0), (True, False, 2), (True, True, 2)]
)
def test_each_batch_names_its_rows_index_positions(index, style, shuffle, mix, workers):
    everyone = []
    for rank in range(2):
        loader = make_loader(
            index,
            style=style,
            batch_size=64,
            shuffle=shuffle,
            mix=mix,
            seed=5,
            rank=rank,
            world_size=2,
            num_workers=workers,
        )
        set_epoch(loader, 2)
        everyone.append(_check(index, loader))
    every = np.concatenate(everyone)
    assert np.array_equal(np.sort(every), np.arange(len(index)))


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_a_resumed_epoch_names_the_positions_of_the_rest(index, style):
    loader = make_loader(index, style=style, batch_size=32, shuffle=True, seed=1, num_workers=0)
    set_epoch(loader, 1)
    it = iter(loader)
    first = _check(index, [next(it) for _ in range(5)])
    state = loader.state_dict()
    again = make_loader(index, style=style, batch_size=32, shuffle=True, seed=1, num_workers=0)
    again.load_state_dict(state)
    assert np.array_equal(np.sort(again.delivered_positions()), np.sort(first))
    rest = _check(index, again)
    assert np.array_equal(np.sort(np.concatenate([first, rest])), np.arange(len(index)))


def test_a_row_sample_carries_its_position(index):
    row = MapDataset(index)[417]
    assert int(row[POSITION_KEY]) == 417
    assert row[index.id_field] == index.ids[417].as_py()


def test_a_column_named_like_the_position_key_is_refused(index):
    with pytest.raises(UnreadableType, match="index position"):
        check_readable(index.schema, [POSITION_KEY])
