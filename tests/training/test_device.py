"""The GPU path's logic, proven without a GPU: which device, which backend, what is pinned,
what moves, and checkpoints whose bytes do not depend on the device.

A CUDA device cannot exist here; torch's ``meta`` device stands in where a tensor must really
move (it has no data, so only placement is checked), and a recording ``pin_memory`` where a
batch must really be pinned. ``bench/gpu.py`` measures the real thing on a GPU machine.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn

from pipeline.readers import make_loader
from pipeline.readers.index import Index
from pipeline.training import (
    REFERENCE_TRAINER,
    DeviceError,
    FitContext,
    PredictContext,
    choose_device,
    cpu_state_dict,
    hash_checkpoint,
    load_trainer,
    process_group_backend,
    run_fit,
    to_device,
)
from pipeline.training.model import MLP, load_checkpoint
from pipeline.training.reference_config import ReferenceConfig, checkpoint_config
from resources.settings import LithiEnv, SettingsError
from tests.helpers.bundles import make_input, stage_result


# -- the device -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("setting", "local_rank", "cuda", "count", "expected"),
    [
        ("auto", 0, False, 0, "cpu"),
        ("auto", 3, False, 0, "cpu"),
        ("auto", 0, True, 2, "cuda:0"),
        ("auto", 1, True, 2, "cuda:1"),
        ("cuda", 1, True, 2, "cuda:1"),
        ("cuda:1", 0, True, 2, "cuda:1"),
        ("cpu", 1, True, 2, "cpu"),
    ],
)
def test_the_device_follows_the_local_rank_and_the_setting(
    setting, local_rank, cuda, count, expected
):
    got = choose_device(setting, local_rank=local_rank, cuda_available=cuda, cuda_count=count)
    assert got == torch.device(expected)


def test_the_local_rank_comes_from_torchruns_environment(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert choose_device("auto", cuda_available=True, cuda_count=2) == torch.device("cuda:1")
    monkeypatch.delenv("LOCAL_RANK")
    assert choose_device("auto", cuda_available=True, cuda_count=2) == torch.device("cuda:0")


@pytest.mark.parametrize(
    ("setting", "cuda", "count", "message"),
    [
        ("cuda", False, 0, "CUDA is not available"),
        ("cuda:0", False, 0, "CUDA is not available"),
        ("cuda:2", True, 2, "no cuda:2, this process sees 2"),
        ("auto", True, 1, "local rank 1: one GPU per local rank"),
        ("gpu", True, 1, "expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ("cuda:x", True, 1, "expected 'auto'"),
    ],
)
def test_a_device_that_cannot_be_used_is_refused_in_one_line(setting, cuda, count, message):
    with pytest.raises(DeviceError, match=message) as err:
        choose_device(setting, local_rank=1, cuda_available=cuda, cuda_count=count)
    assert "\n" not in str(err.value)


def test_this_machine_without_cuda_trains_on_the_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: auto picks it (covered by the parametrized cases)")
    assert choose_device() == torch.device("cpu")


def test_lithi_device_is_checked_when_settings_load(monkeypatch):
    monkeypatch.setenv("LITHI_DEVICE", "cuda:1")
    assert LithiEnv.load().device == "cuda:1"
    monkeypatch.setenv("LITHI_DEVICE", "tpu")
    with pytest.raises(SettingsError, match="LITHI_DEVICE"):
        LithiEnv.load()


# -- the process group ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("device", "backend"),
    [
        ("cpu", "gloo"),
        ("cuda:0", "cpu:gloo,cuda:nccl"),
        (torch.device("cuda", 3), "cpu:gloo,cuda:nccl"),
    ],
)
def test_the_backend_follows_the_device(device, backend):
    assert process_group_backend(device) == backend


# -- pinning and moving ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Index:
    """90 input items: what the loaders of this section read."""
    return Index.from_snapshot(make_input(tmp_path_factory.mktemp("dev") / "b", n=90))


@pytest.mark.parametrize(("device", "pinned"), [("cpu", False), ("cuda:0", True)])
def test_a_contexts_loader_pins_only_for_cuda(index, tmp_path, device, pinned):
    ctx = FitContext(
        index=index,
        config={},
        rank=0,
        world_size=1,
        num_workers=0,
        log=lambda _: None,
        output_dir=tmp_path,
        device=device,
    )
    assert ctx.device == torch.device(device)
    assert ctx.loader(batch_size=8).loader.pin_memory is pinned
    predict = PredictContext(
        index=index,
        config={},
        num_workers=0,
        log=lambda _: None,
        checkpoint_dir=tmp_path,
        checkpoint_sha256="0" * 64,
        device=device,
    )
    assert predict.loader(batch_size=8).loader.pin_memory is pinned


@pytest.mark.parametrize("style", ["map", "iterable"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_pinning_loader_pins_every_tensor_once_per_message_and_leaves_strings(
    index, monkeypatch, style, workers
):
    plain = make_loader(index, style=style, batch_size=8, num_workers=workers, seed=3)
    expected = list(plain)
    pinned_ptrs: set[int] = set()
    calls = []

    def fake_pin(self, device=None):  # no CUDA here: a copy that remembers it was made
        out = self.clone()
        calls.append(out.shape[0])
        pinned_ptrs.add(out.untyped_storage().data_ptr())
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    loader = make_loader(index, style=style, batch_size=8, num_workers=workers, seed=3,
                         pin_memory=True)  # fmt: skip
    got = list(loader)
    assert [b["id"] for b in got] == [b["id"] for b in expected]
    for mine, theirs in zip(got, expected, strict=True):
        assert all(isinstance(v, str) for v in mine["id"])
        for k, v in mine.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, theirs[k])
                assert v.untyped_storage().data_ptr() in pinned_ptrs, f"{k} was not pinned"
    # Pinned per worker message, not per batch: with workers, messages hold many batches.
    tensor_columns = sum(isinstance(v, torch.Tensor) for v in got[0].values())
    assert len(calls) % tensor_columns == 0
    assert len(calls) // tensor_columns <= len(got)


def test_moving_a_batch_moves_tensors_and_leaves_ids_as_the_same_strings():
    ids = ["a-1", "a-2"]
    batch = {"id": ids, "x": torch.arange(2.0), "ok": torch.tensor([True, False])}
    moved = to_device(batch, "meta")  # a real move to another device, without a GPU
    assert moved["id"] is ids
    assert moved["x"].device.type == "meta" and moved["ok"].device.type == "meta"
    assert batch["x"].device.type == "cpu", "the input batch is not changed"
    assert to_device(batch, "cpu")["x"] is batch["x"], "already there: no copy"


# -- checkpoints ----------------------------------------------------------------------------
def test_a_checkpoint_is_saved_from_cpu_copies_with_todays_bytes(tmp_path):
    torch.manual_seed(0)
    model = MLP(5, 16, 3)
    state = cpu_state_dict(model)
    params = dict(model.state_dict())
    for k, v in state.items():
        assert v.device.type == "cpu"
        assert torch.equal(v, params[k])
        assert v.untyped_storage().data_ptr() != params[k].untyped_storage().data_ptr()

    def saved(state_dict) -> bytes:
        buf = io.BytesIO()
        torch.save({"state_dict": state_dict}, buf)
        return buf.getvalue()

    # The checkpoint as it was written before devices existed: weights cloned in place.
    assert saved(state) == saved({k: v.detach().clone() for k, v in params.items()})


def test_the_checkpoint_config_leaves_later_fields_out_at_their_default():
    later = {
        "amp",
        "mix",
        "one_hot_max",
        "max_categories",
        "missing",
        "flush_denormals",
        "host_allreduce",
    }
    default = checkpoint_config(ReferenceConfig())
    assert set(default) == set(ReferenceConfig.model_fields) - later
    assert checkpoint_config(ReferenceConfig(amp=True))["amp"] is True
    assert checkpoint_config(ReferenceConfig(mix=True))["mix"] is True
    assert checkpoint_config(ReferenceConfig(missing="drop"))["missing"] == "drop"
    assert checkpoint_config(ReferenceConfig(one_hot_max=4))["one_hot_max"] == 4
    assert checkpoint_config(ReferenceConfig(flush_denormals=False))["flush_denormals"] is False
    assert checkpoint_config(ReferenceConfig(host_allreduce=False))["host_allreduce"] is False


def _result_index(tmp_path) -> Index:
    rng = np.random.default_rng(0)
    n = 400
    y = rng.integers(0, 2, n)
    x = rng.normal(size=n) + 2 * y
    status = np.where(rng.random(n) < 0.1, "failed", "accepted")
    table = pa.table(
        {
            "id": [f"{i:04d}" for i in range(n)],
            "x": x,
            "lithi_label": pa.array([int(v) for v in y], pa.int64()),
            "lithi_status": status,
            "lithi_confidence": pa.array(
                [None if s == "failed" else 0.9 for s in status], pa.float32()
            ),
            "lithi_verification": ["agree"] * n,
        }
    )
    return Index.from_snapshot(stage_result(table, tmp_path / "r", rows_per_part=150))


def test_the_reference_trainer_on_an_explicit_cpu_writes_the_default_devices_checkpoint(
    tmp_path,
):
    index = _result_index(tmp_path)
    trainer = load_trainer(REFERENCE_TRAINER)
    config = {"features": ["x"], "epochs": 2}
    digests = []
    for name, device in (("auto", choose_device("auto")), ("cpu", "cpu")):
        out = tmp_path / name
        out.mkdir()
        run = run_fit(trainer, index, config, output_dir=out, log=lambda _: None, device=device)
        assert run.device == torch.device(device).type
        digests.append(hash_checkpoint(out).sha256)
    assert digests[0] == digests[1]
    _, spec = load_checkpoint(tmp_path / "cpu" / "model.pt")
    assert spec.label == "lithi_label"


def test_bf16_autocast_trains_and_is_recorded_in_the_checkpoint(tmp_path):
    index = _result_index(tmp_path)
    trainer = load_trainer(REFERENCE_TRAINER)
    out = tmp_path / "amp"
    out.mkdir()
    run = run_fit(
        trainer, index, {"features": ["x"], "epochs": 3, "amp": True}, output_dir=out,
        log=lambda _: None,
    )  # fmt: skip
    assert run.reconciliation.ok
    assert run.result.metrics["holdout_accuracy"] > 0.8
    ckpt = torch.load(out / "model.pt", weights_only=True)
    assert ckpt["config"]["amp"] is True
    assert all(v.dtype == torch.float32 for v in ckpt["state_dict"].values())
    assert json.loads(json.dumps(ckpt["config"])) == ckpt["config"]


def test_cpu_state_dict_unwraps_nothing_and_copies_buffers():
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    state = cpu_state_dict(net)
    assert set(state) == set(net.state_dict())
    assert state["1.running_mean"].device.type == "cpu"
