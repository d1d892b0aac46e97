"""Launched by ``tests/integration/test_torchrun.py`` under torchrun: read a bundle on every
rank, train DDP.

Each rank reads its share with both readers (2 DataLoader workers each), trains a tiny DDP model
on every batch inside ``Join`` (the shares are uneven, so without it the longer rank's last
all-reduce would wait forever), writes the ids it yielded, and reconciles across ranks.
``--no-join`` runs the same loop without ``Join``, to show that it then fails when gloo's
``--gloo-timeout`` (15 s unless told) runs out. Each rank writes its pid to ``pid-rank<R>``.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from pipeline.bundle.verify import verify
from pipeline.readers.index import Index
from pipeline.readers.loader import make_loader, set_epoch
from pipeline.readers.reconcile import Tally, reconcile_distributed


def train_epoch(loader, index, ddp, opt, *, join: bool) -> tuple[Tally, list[str], int]:
    """One epoch of DDP steps: the tally, the ids the batches held, and the steps taken."""
    tally = Tally(index.id_field, label=f"rank{dist.get_rank()}", index_ids=index.ids)
    ids: list[str] = []
    steps = 0

    def loop() -> None:
        nonlocal steps
        for batch in loader:
            tally.update(batch)
            ids.extend(batch[index.id_field])
            loss = torch.nn.functional.mse_loss(
                ddp(batch["x"]).squeeze(1), batch["label"].to(torch.float32)
            )
            opt.zero_grad()
            loss.backward()  # DDP all-reduces gradients here: every rank must take part
            opt.step()
            steps += 1

    if join:
        with Join([ddp]):  # ranks that run out shadow the others' all-reduces
            loop()
    else:
        loop()
    return tally, ids, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-join", action="store_true")
    ap.add_argument("--gloo-timeout", type=float, default=15.0)
    args = ap.parse_args()
    # the test scopes its /dev/shm leftover check to these processes
    Path(args.out, f"pid-rank{os.environ['RANK']}").write_text(str(os.getpid()))
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.gloo_timeout))
    rank = dist.get_rank()
    out = Path(args.out)
    index = Index.from_snapshot(verify(args.bundle))
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Linear(index.schema.field("x").arrow_type.list_size, 1))
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-6)
    summary = {}
    for style, batch_size in (("map", 8), ("iterable", 16)):
        loader = make_loader(
            index, style=style, batch_size=batch_size, num_workers=2, seed=7, shuffle=True
        )
        set_epoch(loader, 1)
        tally, ids, steps = train_epoch(loader, index, ddp, opt, join=not args.no_join)
        (out / f"{style}-rank{rank}.txt").write_text("".join(f"{i}\n" for i in ids))
        report = reconcile_distributed(index.manifest, tally.counts, ids=index.ids)
        summary[style] = {"steps": steps, "report": report.as_dict()}
    summary["weight"] = ddp.module.weight.detach().flatten().tolist()
    (out / f"summary-rank{rank}.json").write_text(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
