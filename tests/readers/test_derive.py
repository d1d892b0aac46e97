"""A derive function on the readers' loader (``pipeline.readers.derive``), in this process: its
tensors replace the columns read, what every batch carries stays, batches are cut through both,
and what it may not return is refused naming the problem."""

from __future__ import annotations

import pytest
import torch

from pipeline.readers import make_loader, set_epoch
from pipeline.readers.tensors import POSITION_KEY


def doubled(batch) -> dict[str, torch.Tensor]:
    return {"__x2": batch["x"] * 2}


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_derived_tensors_replace_the_columns_read_and_the_carried_ones_stay(index, style):
    kw = dict(style=style, batch_size=16, num_workers=0, seed=5, transfer_batches=4)
    plain = make_loader(index, **kw)
    derived = make_loader(index, derive=doubled, **kw)
    set_epoch(plain, 2)
    set_epoch(derived, 2)
    pairs = list(zip(plain, derived, strict=True))
    assert pairs
    for p, d in pairs:
        assert set(d) == {
            "item_id", "lithi_status", "lithi_confidence", "lithi_confidence__valid",
            "lithi_verification", POSITION_KEY, "__x2",
        }  # fmt: skip
        assert d["item_id"] == p["item_id"]  # still a list of strings, row for row
        assert torch.equal(d[POSITION_KEY], p[POSITION_KEY])
        assert torch.equal(d["__x2"], p["x"] * 2)  # cut with the batch, row for row


def test_set_derive_applies_from_the_next_epoch_and_none_reads_the_columns_again(index):
    loader = make_loader(index, style="map", batch_size=64, num_workers=0, seed=1)
    set_epoch(loader, 0)
    assert "x" in next(iter(loader))
    loader.set_derive(doubled)
    set_epoch(loader, 1)
    first = next(iter(loader))
    assert "__x2" in first and "x" not in first
    loader.set_derive(None)
    set_epoch(loader, 2)
    assert "x" in next(iter(loader))


@pytest.mark.parametrize(
    "derive, error, says",
    [
        (lambda b: {"item_id": b["x"]}, ValueError, "a column every batch carries"),
        (lambda b: {POSITION_KEY: b["x"]}, ValueError, "a column every batch carries"),
        (lambda b: {"__n": [1, 2]}, TypeError, "a CPU tensor is expected"),
        (lambda b: {"__one": b["x"][:1]}, ValueError, "one row per row of the batch"),
        (lambda b: {"__scalar": b["x"].sum()}, ValueError, "one row per row of the batch"),
        (lambda b: {"__bf16": b["x"].bfloat16()}, TypeError, "as torch.bfloat16"),
    ],
)
def test_what_a_derive_may_not_return_is_refused_by_name(index, derive, error, says):
    loader = make_loader(index, style="iterable", batch_size=32, num_workers=0, derive=derive)
    with pytest.raises(error, match=says):
        next(iter(loader))


def test_what_is_derived_cannot_change_under_a_loaded_state(index):
    loader = make_loader(index, style="map", batch_size=32, num_workers=0, seed=2)
    set_epoch(loader, 0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    again = make_loader(index, style="map", batch_size=32, num_workers=0, seed=2)
    again.load_state_dict(state)
    with pytest.raises(ValueError, match="waits to be resumed"):
        again.set_derive(doubled)
