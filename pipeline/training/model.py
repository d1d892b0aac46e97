"""The reference model and its checkpoint: weights and plain data, loaded with ``weights_only``.

A checkpoint never holds pickled code, so loading one cannot run anything; the feature spec
and config travel as plain data beside the weights.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.bundle.atomic import atomic_write_bytes
from pipeline.bundle.digest import sha256_file
from pipeline.training.features import FeatureSpec


class Classifier(nn.Module):
    """A small MLP: enough to learn the Compute labels, small enough to train in seconds."""

    def __init__(self, dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for each class."""
        return self.net(x)


def save_checkpoint(
    path: str | os.PathLike,
    *,
    state_dict: dict[str, torch.Tensor],
    spec: FeatureSpec,
    config: dict[str, Any],
    hidden: int,
) -> str:
    """Write the weights, feature spec and config atomically; return the file's sha256."""
    buf = io.BytesIO()
    torch.save(
        {"state_dict": state_dict, "spec": spec.model_dump(), "config": config, "hidden": hidden},
        buf,
    )
    atomic_write_bytes(path, buf.getvalue(), replace=False)
    return sha256_file(path)


def load_checkpoint(path: str | os.PathLike) -> tuple[Classifier, FeatureSpec]:
    """Load a checkpoint with ``weights_only=True``: tensors and plain data, never pickled code."""
    ckpt = torch.load(Path(path), weights_only=True)
    spec = FeatureSpec.model_validate(ckpt["spec"])
    model = Classifier(spec.dim, int(ckpt["hidden"]), len(spec.classes))
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    return model, spec
