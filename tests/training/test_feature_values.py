"""Numbers become model inputs at their stored precision: a float32 column is standardised in
float32 (no float64 copy), a float64 or integer column in float64, and both mark and fill the
same missing values."""

from __future__ import annotations

import torch

from pipeline.readers.tensors import VALID_SUFFIX
from pipeline.training.features import (
    FeatureColumn,
    FeatureSpec,
    ValueCounts,
    all_usable,
    number_values,
    to_features,
    usable_values,
)

ROWS = 257


def _spec(*columns: FeatureColumn, mean: list[float], std: list[float]) -> FeatureSpec:
    return FeatureSpec(task="classification", label="y", columns=list(columns), mean=mean, std=std)


def _reference(batch: dict, spec: FeatureSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Every number in float64, standardised, missing at 0, rounded once: the exact input."""
    parts, oks, start = [], [], 0
    mean = torch.tensor(spec.mean, dtype=torch.float64)
    std = torch.tensor(spec.std, dtype=torch.float64)
    for col in spec.columns:
        x, ok = number_values(batch, col)
        m, s = mean[start : start + col.width], std[start : start + col.width]
        parts.append(torch.where(ok, (x - m) / s, 0.0))
        if col.nullable:
            parts.append(ok.all(dim=1, keepdim=True).to(torch.float64))
        oks.append(ok)
        start += col.width
    return torch.cat(parts, dim=1).to(torch.float32), torch.cat(oks, dim=1)


def _batch() -> dict:
    g = torch.Generator().manual_seed(3)
    emb = (torch.randn(ROWS, 4, generator=g) * 50 + 1e3).to(torch.float32)
    emb[::7, 1] = float("nan")
    emb[3, 2] = float("inf")
    score = torch.randn(ROWS, generator=g).to(torch.float32)
    valid = torch.rand(ROWS, generator=g) > 0.2
    score[~valid] = 7.0  # a null's slot may hold anything: the mask, not the value, decides
    score[5] = float("nan")  # and a NaN under a valid mask is missing too
    valid[5] = True
    stamp = 1_700_000_000_000_000 + torch.arange(ROWS, dtype=torch.int64) * 1_000_003
    return {"emb": emb, "score": score, "score" + VALID_SUFFIX: valid, "stamp": stamp}


def _columns() -> tuple[FeatureColumn, ...]:
    return (
        FeatureColumn(name="emb", width=4, nullable=False),
        FeatureColumn(name="score", width=1, nullable=True),
        FeatureColumn(name="stamp", width=1, nullable=False),
    )


def _stats() -> tuple[list[float], list[float]]:
    mean = [1e3, 999.5, 1001.25, 1e3, 0.1, 1_700_000_000_128_000.0]
    std = [50.0, 49.0, 51.0, 50.0, 1.1, 74_000_000.0]
    return mean, std


def test_float32_columns_are_standardised_in_float32_within_rounding():
    batch, (mean, std) = _batch(), _stats()
    spec = _spec(*_columns(), mean=mean, std=std)
    got = to_features(batch, spec)
    want, ok = _reference(batch, spec)
    assert got.dtype == torch.float32 and got.shape == want.shape == (ROWS, 7)
    # missing values and the validity indicator: exactly where the float64 rule puts them
    assert torch.equal(got == 0, want == 0) and torch.equal(got[:, 5], want[:, 5])
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=2e-6, atol=2e-6)


def test_integer_and_float64_columns_keep_their_float64_precision():
    """A microsecond timestamp is not representable in float32: it is standardised first."""
    batch, (mean, std) = _batch(), _stats()
    batch["wide"] = batch["emb"][:, 0].to(torch.float64) + 1e-9
    wide = FeatureColumn(name="wide", width=1, nullable=False)
    stamp = FeatureColumn(name="stamp", width=1, nullable=False)
    spec = _spec(stamp, wide, mean=mean[-1:] + mean[:1], std=std[-1:] + std[:1])
    assert torch.equal(to_features(batch, spec), _reference(batch, spec)[0])
    assert len(set(to_features(batch, spec)[:, 0].tolist())) == ROWS  # every stamp apart


def test_missing_values_are_counted_and_masked_alike_on_every_path():
    batch, (mean, std) = _batch(), _stats()
    spec = _spec(*_columns(), mean=mean, std=std)
    counts = ValueCounts()
    with_counts = to_features(batch, spec, counts=counts)
    assert torch.equal(with_counts, to_features(batch, spec))
    _, ok = _reference(batch, spec)
    assert int(counts.filled["emb"]) == int((~ok[:, :4]).sum()) == len(range(0, ROWS, 7))
    assert int(counts.filled["score"]) == int((~batch["score" + VALID_SUFFIX]).sum()) + 1
    assert int(counts.filled["stamp"]) == 0
    for col in spec.columns:
        assert torch.equal(usable_values(batch, col), number_values(batch, col)[1])
        assert all_usable(batch, col) == bool(usable_values(batch, col).all())
    clean = {"emb": batch["emb"][1:7], "stamp": batch["stamp"]}  # rows with nothing missing
    assert all_usable(clean, spec.columns[0]) and all_usable(clean, spec.columns[2])
