"""A derive function on the readers' loader (``pipeline.readers.derive``), in this process: its
tensors replace the columns read, what every batch carries stays, batches are cut through both,
and what it may not return is refused naming the problem."""

from __future__ import annotations

import pytest
import torch

from pipeline.readers import make_loader, set_epoch
from pipeline.readers.derive import Summary
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
        (lambda b: {"__n": [1, 2]}, TypeError, "a CPU tensor .* or a Summary is expected"),
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


def summed(batch) -> dict:
    return {"__sum": Summary((len(batch["item_id"]), float(batch["x"].sum())))}


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_a_summary_of_each_message_comes_whole_and_alone_beside_the_carried_columns(index, style):
    kw = dict(style=style, batch_size=16, num_workers=0, seed=3, transfer_batches=4)
    plain = make_loader(index, **kw)
    loader = make_loader(index, derive=summed, **kw)
    loader.set_batch_size(loader.message_rows)  # whole messages
    set_epoch(plain, 1)
    set_epoch(loader, 1)
    rows, total, seen = 0, 0.0, 0
    for b in loader:
        assert "x" not in b and isinstance(b["__sum"], Summary)
        n, s = b["__sum"].value
        assert n == len(b["item_id"]) == len(b[POSITION_KEY])  # the summary of this batch
        rows, total, seen = rows + n, total + s, seen + 1
    assert rows == len(index) and seen > 1  # every row, summed message by message
    assert total == pytest.approx(sum(float(b["x"].sum()) for b in plain))


def test_a_summary_is_never_cut_into_batches(index):
    loader = make_loader(
        index, style="iterable", batch_size=16, num_workers=0, transfer_batches=4, derive=summed
    )
    with pytest.raises(ValueError, match=r"cannot be cut into batches of 16 rows.*message_rows"):
        next(iter(loader))
