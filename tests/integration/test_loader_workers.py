"""The readers through real DataLoader worker processes, several ranks' worth: exactly once,
the batched transfer, the idle-owner warning said once, and an epoch stopped and resumed with 1
and 3 workers."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

from pipeline.readers import (
    IdleOwnerWarning,
    Index,
    Owner,
    make_loader,
    set_epoch,
)
from tests.helpers.bundles import make_bundle
from tests.helpers.resume import check_every_rank, cut_and_reshape, resume_index


@pytest.mark.parametrize("style", ["map", "iterable"])
@pytest.mark.parametrize("world,workers", [(2, 2), (3, 3)])
def test_real_dataloader_workers_exactly_once(index, style, world, workers):
    got: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IdleOwnerWarning)
        for r in range(world):
            loader = make_loader(
                index,
                style=style,
                batch_size=32,
                num_workers=workers,
                rank=r,
                world_size=world,
                seed=11,
                shuffle=True,
                persistent_workers=False,
                multiprocessing_context="fork",
            )
            set_epoch(loader, 3)
            for b in loader:
                assert isinstance(b["item_id"], list)
                got.extend(b["item_id"])
    assert len(got) == len(index) and sorted(got) == sorted(index.ids.to_pylist())


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_transfer_batches_yields_the_same_batches(index, style):
    """What larger worker messages change, and only that (docs/readers.md says the same)."""
    kw = dict(style=style, batch_size=32, num_workers=2, rank=1, world_size=2, seed=4)
    plain = [tuple(b["item_id"]) for b in make_loader(index, transfer_batches=1, **kw)]
    split = make_loader(index, transfer_batches=4, **kw)
    set_epoch(split, 0)
    grouped = [tuple(b["item_id"]) for b in split]
    assert Counter(grouped) == Counter(plain)  # the same batches, each item once
    assert len({x for b in grouped for x in b}) == sum(map(len, grouped))
    if style == "map":  # same sampler order, cut at the same places
        assert grouped == plain
        return
    # iterable: each worker-owner's batches keep their order, but arrive 4 at a time from one
    # worker instead of alternating worker by worker
    owner_of = {
        x: w
        for w in range(2)
        for p in split.dataset.parts_for(Owner(1, 2, w, 2))
        for x in index.ids[index.part_offsets[p] : index.part_offsets[p + 1]].to_pylist()
    }
    for w in range(2):
        assert [b for b in grouped if owner_of[b[0]] == w] == [
            b for b in plain if owner_of[b[0]] == w
        ]
    assert grouped != plain
    assert [owner_of[b[0]] for b in plain[:4]] == [0, 1, 0, 1]
    assert [owner_of[b[0]] for b in grouped[:4]] == [0, 0, 0, 0]


def test_idle_owner_warns_once_per_owner_not_per_epoch_or_worker(tmp_path, capfd, caplog):
    two = Index.from_snapshot(make_bundle(tmp_path, [40, 30]))
    with pytest.warns(IdleOwnerWarning) as caught:
        loader = make_loader(
            two,
            style="iterable",
            batch_size=8,
            num_workers=3,
            rank=0,
            world_size=1,
            multiprocessing_context="fork",
        )
    idle = [w for w in caught if issubclass(w.category, IdleOwnerWarning)]
    assert len(idle) == 1 and "owner 2 of 3" in str(idle[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdleOwnerWarning)
        for epoch in range(2):
            set_epoch(loader, epoch)
            assert sum(len(b["item_id"]) for b in loader) == 70
    assert "IdleOwnerWarning" not in capfd.readouterr().err  # no worker said it again
    assert not [r for r in caplog.records if "no part to read" in r.getMessage()]


# -- resuming, wired in more ways than tests/readers/test_resume.py (0 workers; 2 by 4) --


@pytest.fixture(scope="module")
def resume_index_(tmp_path_factory) -> Index:
    return resume_index(tmp_path_factory.mktemp("resume"))


@pytest.mark.parametrize("k", ["first", "middle", "last"])
@pytest.mark.parametrize(("workers", "transfer"), [(1, 4), (2, 1), (3, 4)])
@pytest.mark.parametrize("style", ["map", "iterable"])
def test_stop_after_k_batches_and_resume_exactly_once(resume_index_, style, workers, transfer, k):
    check_every_rank(resume_index_, style, workers, transfer, k, world=2)


@pytest.mark.parametrize(("world", "workers", "k"), [(1, 2, "middle"), (3, 2, "middle")])
@pytest.mark.parametrize("style", ["map", "iterable"])
def test_resume_on_other_rank_counts(resume_index_, style, world, workers, k):
    check_every_rank(resume_index_, style, workers, 4, k, world=world)


@pytest.mark.parametrize(
    ("before", "after"),
    [((2, 3), (3, 2)), ((1, 2), (3, 1)), ((3, 1), (1, 3)), ((2, 2), (2, 3))],
    ids=lambda s: f"{s[0]}x{s[1]}",
)
@pytest.mark.parametrize("mix", [False, True], ids=["plain", "mix"])
@pytest.mark.parametrize("style", ["map", "iterable"])
def test_resume_at_another_shape_with_worker_processes(resume_index_, style, before, after, mix):
    head, tail, _ = cut_and_reshape(
        resume_index_, style, before, after, "middle", real=True, mix=mix
    )
    assert len(head) + len(tail) == len(resume_index_)
    assert sorted(head + tail) == resume_index_.ids.to_pylist()
