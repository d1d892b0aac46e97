"""The reference model and its checkpoint: weights and plain data, loaded with ``weights_only``.

A checkpoint never holds pickled code, so loading one cannot run anything; the feature spec
and config travel as plain data beside the weights.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.bundle.atomic import atomic_write_bytes
from pipeline.training.features import FeatureSpec


class MLP(nn.Module):
    """A small multilayer perceptron: class logits, or one regressed value.

    ``embeddings`` lists ``(codes, size)`` per embedded category column
    (:attr:`FeatureSpec.embeddings`): the input then ends with one code per such column, which
    the model looks up; code 0 (a null or an unseen value) is a zero vector, never trained.
    ``dim`` is the width after the lookup.
    """

    def __init__(
        self, dim: int, hidden: int, outputs: int, embeddings: Sequence[tuple[int, int]] = ()
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, outputs),
        )
        self.embeddings: nn.ModuleList | None = None
        if embeddings:  # made after the layers: a model without any draws the weights it did
            self.embeddings = nn.ModuleList(
                nn.Embedding(codes, size, padding_idx=0) for codes, size in embeddings
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for each class (classification) or the standardised value (regression)."""
        if self.embeddings is not None:
            k = len(self.embeddings)
            codes = x[:, -k:].long()
            looked_up = [e(codes[:, i]) for i, e in enumerate(self.embeddings)]
            x = torch.cat([x[:, :-k], *looked_up], dim=1)
        return self.net(x)


#: Rows per forward call when the model scores on the CPU: the activations of this many rows
#: stay in a core's cache, where a forward of several thousand rows at once runs about a third
#: slower per row (docs/performance.md).
CPU_FORWARD_ROWS = 1024


def scores(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model(x)`` for scoring (no gradient wanted), on the CPU in :data:`CPU_FORWARD_ROWS` slices.

    A batch stays as large as its caller likes (its per-batch Python work is paid once); only
    the arithmetic is sliced. Each row's output depends on that row alone. On a GPU the whole
    batch goes at once, which is what keeps it busy.
    """
    if x.device.type != "cpu" or len(x) <= CPU_FORWARD_ROWS:
        return model(x)
    return torch.cat([model(part) for part in x.split(CPU_FORWARD_ROWS)])


def model_for(spec: FeatureSpec, hidden: int) -> MLP:
    """The MLP a :class:`FeatureSpec` takes, initialised from torch's current random state."""
    return MLP(spec.dim, hidden, spec.outputs, spec.embeddings)


def save_checkpoint(
    path: str | os.PathLike,
    *,
    state_dict: dict[str, torch.Tensor],
    spec: FeatureSpec,
    config: dict[str, Any],
    hidden: int,
) -> None:
    """Write the weights, feature spec and config atomically, never over an existing file.

    The plain data goes through JSON first, so the pickle inside is a function of the values
    alone (not of which equal strings happened to be one object): the same fit writes the same
    bytes in any process, and its digest identifies it.
    """
    plain = json.loads(json.dumps({"spec": spec.model_dump(mode="json"), "config": config}))
    buf = io.BytesIO()
    torch.save({"state_dict": state_dict, **plain, "hidden": hidden}, buf)
    atomic_write_bytes(path, buf.getvalue(), replace=False)


def load_checkpoint(path: str | os.PathLike) -> tuple[MLP, FeatureSpec]:
    """Load a checkpoint with ``weights_only=True``: tensors and plain data, never pickled code."""
    ckpt = torch.load(Path(path), weights_only=True)
    spec = FeatureSpec.model_validate(ckpt["spec"])
    model = model_for(spec, int(ckpt["hidden"]))
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    return model, spec
