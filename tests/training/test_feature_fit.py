"""The fitting pass's normalisation: the mean and spread of every usable value of the rows used
for fitting (accepted ones), in float64, whether a batch misses values or not (a batch with
none takes a path without masks, and must agree with the one that masks)."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from pipeline.bundle.manifest import SchemaField
from pipeline.readers.derive import Summary
from pipeline.readers.tensors import VALID_SUFFIX
from pipeline.training.feature_fit import FIT_SUMS, fit_features, fitting_sums

ROWS = 300
FIELDS = [
    SchemaField(name="emb", type="fixed_size_list<float32,3>", nullable=False),
    SchemaField(name="score", type="float64", nullable=True),
    SchemaField(name="count", type="int64", nullable=False),
]


def _batches(nan_at: int | None) -> list[dict]:
    g = np.random.default_rng(5)
    emb = (g.normal(size=(ROWS, 3)) * 40 + 500).astype(np.float32)
    score = g.normal(size=ROWS)
    count = g.integers(0, 1_000, size=ROWS)
    status = ["accepted" if i % 4 else "failed" for i in range(ROWS)]
    label = np.arange(ROWS) % 3
    if nan_at is not None:
        emb[nan_at, 1] = np.nan
    out = []
    for lo in range(0, ROWS, 64):  # batches of 64, the last one short
        sl = slice(lo, lo + 64)
        out.append(
            {
                "emb": torch.from_numpy(emb[sl].copy()),
                "score": torch.from_numpy(score[sl].copy()),
                "score" + VALID_SUFFIX: torch.ones(len(label[sl]), dtype=torch.bool),
                "count": torch.from_numpy(count[sl].copy()),
                "lithi_status": status[sl],
                "y": torch.from_numpy(label[sl].copy()),
            }
        )
    return out


def _fit(batches: list[dict]):
    return fit_features(batches, FIELDS, task="classification", label="y", has_status=True)


def _expected(batches: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per feature value, over the accepted rows where it is not NaN, in float64."""
    cols = []
    for b in batches:
        keep = np.array([s == "accepted" for s in b["lithi_status"]])
        x = np.concatenate(
            [b["emb"].numpy(), b["score"].numpy()[:, None], b["count"].numpy()[:, None]], axis=1
        ).astype(np.float64)
        cols.append(x[keep])
    x = np.concatenate(cols)
    mean = np.nanmean(x, axis=0)
    return mean, np.sqrt(np.nanmean(x * x, axis=0) - mean * mean)


def test_batches_with_no_missing_value_are_fitted_as_the_float64_reference():
    batches = _batches(nan_at=None)
    fitted = _fit(batches)
    mean, std = _expected(batches)
    np.testing.assert_allclose(fitted.spec.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(fitted.spec.std, std, rtol=1e-9)
    assert fitted.rows == sum(s == "accepted" for b in batches for s in b["lithi_status"])
    assert fitted.missing == {"emb": 0, "score": 0, "count": 0}


def test_a_batch_missing_a_value_takes_the_masked_path_and_both_agree():
    batches = _batches(nan_at=70)  # accepted (70 % 4 != 0), in the second batch
    fitted = _fit(batches)
    mean, std = _expected(batches)
    np.testing.assert_allclose(fitted.spec.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(fitted.spec.std, std, rtol=1e-9)
    assert fitted.missing["emb"] == 1 and fitted.incomplete_rows == 1
    # the other columns and the other batches are what they were without the NaN
    clean = _fit(_batches(nan_at=None))
    assert fitted.spec.mean[2:] == clean.spec.mean[2:]  # the same path, the same bits
    np.testing.assert_allclose(fitted.spec.mean[0], clean.spec.mean[0], rtol=1e-12)


def test_sums_made_where_batches_are_read_fit_as_the_batches_summed_here():
    # A worker's sums of its batches (fitting_sums) arrive as one value a batch; added, they fit
    # what summing the batches here fits: the same counts, classes and missing values, and the
    # normalisation to the last bits of another order of addition.
    batches = _batches(nan_at=70)
    summing = fitting_sums(FIELDS, task="classification", label="y", has_status=True)
    carried = [
        {"lithi_status": b["lithi_status"], **summing(b)} for b in batches
    ]  # what crosses: the carried columns and the summary
    assert all(isinstance(b[FIT_SUMS], Summary) and "emb" not in b for b in carried)
    here, there = _fit(batches), _fit(carried)
    assert there.rows == here.rows and there.missing == here.missing
    assert there.incomplete_rows == here.incomplete_rows
    assert there.spec.classes == here.spec.classes
    np.testing.assert_allclose(there.spec.mean, here.spec.mean, rtol=1e-13)
    np.testing.assert_allclose(there.spec.std, here.spec.std, rtol=1e-12)


def test_a_workers_sums_cross_the_pipe_as_arrays_not_shared_memory_segments():
    # torch pickles a tensor for another process as a shared-memory segment of its own, whose
    # handover cost a worker more than its sums; the sums pickle as numpy arrays instead.
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions, as a worker has)

    summing = fitting_sums(FIELDS, task="classification", label="y", has_status=True)
    sums = summing(_batches(nan_at=None)[0])[FIT_SUMS].value
    wire = bytes(ForkingPickler.dumps(sums))
    assert b"rebuild_storage" not in wire and b"torch" not in wire
    back = pickle.loads(wire)
    for name in ("sums", "target", "tally"):
        assert torch.equal(getattr(back, name), getattr(sums, name))
    assert back.classes == sums.classes and back.seen == sums.seen
