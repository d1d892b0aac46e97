"""The Ray job ``training_run`` submits (``LITHI_LAUNCHER=ray``): ranks as Ray actors, one
process group, resumed on the nodes left when a node dies.

The job's entry point (this module's :func:`main`) runs on the cluster as the job's driver. It
takes the cluster-wide claim on the fit's cuts (a named actor: one live fit per cut, released
when the driver dies however it dies), places ``--workers`` rank actors spread over the nodes,
and has them form one torch process group (gloo, or NCCL beside it on GPUs) at rank 0's node.
Every rank then works on its own node only:

- fetches the bundle from the run's exchange URL into its node's own cache (``LITHI_CACHE_DIR``
  of the node) and verifies it with that cache's trust;
- loads the step's saved index from the exchange URL (its digest checked: no id decoded);
- trains with the same trainer, readers and reconciliation as every other launch
  (:func:`~pipeline.training.runner.train_once`), its cuts mirrored to the exchange URL;
- rank 0 publishes the checkpoint and the outcome to the attempt's folder there.

When an attempt fails (a node lost, a rank killed), the driver stops every rank and starts the
next attempt (up to ``--max-restarts``) on the ranks the cluster can place now, at most
``--workers``: the readers resume the last committed cut on that shape, the interrupted pass is
reconciled as one, and the outcome names both shapes. The driver speaks Dagster Pipes (its
stdout is the job's log, which ``dagster-ray``'s client reads); the ranks' log lines reach it
through a Ray queue. This module imports ``dagster_pipes`` and Ray, never Dagster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import ray
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.training.progress import CLAIM_WAIT, ProgressError

#: Seconds the driver waits for the cluster to place a rank before it counts that rank out.
RANK_WAIT = 60.0
CLAIM_NAMESPACE = "lithi"


@dataclass(frozen=True)
class RankSpec:
    """What every rank is told: the same for all ranks of one attempt but its place in it."""

    exchange_url: str
    run_id: str
    version_id: str
    progress_key: str
    index_sha256: str
    trainer: str
    config: str
    num_workers: int
    device: str
    checkpoint_every: int
    credential_ref: str
    attempt: int


@ray.remote
class _Claim:
    """Held by the driver while its fit runs: its name is the claim (see :func:`_claim`)."""

    def holder(self) -> str:
        return f"pid {os.getpid()} on {socket.gethostname()}"


@ray.remote(max_concurrency=2)  # it answers a ping while it trains
class Rank:
    """One rank of the fit, on whichever node Ray placed it."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it: where the process group meets."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def train(
        self, spec: dict[str, Any], rank: int, world: int, master: tuple[str, int], logs: Queue
    ) -> str | None:
        """Train as ``rank`` of ``world``; rank 0 returns the outcome's JSON, the others None."""
        return _train_rank(RankSpec(**spec), rank, world, master, logs)


def _train_rank(
    spec: RankSpec, rank: int, world: int, master: tuple[str, int], logs: Queue
) -> str | None:
    import torch
    import torch.distributed as dist

    from pipeline.bundle.contents import ids_decoded
    from pipeline.bundle.digest import file_bytes_hashed
    from pipeline.training.cut_mirror import CutMirror
    from pipeline.training.device import choose_device, process_group_backend
    from pipeline.training.runner import train_once
    from pipeline.training.threads import intra_op_threads, torch_threads
    from pipeline.training.trainer import load_trainer
    from resources.run_exchange import RunExchange, load_index, publish_outcome

    def log(msg: str) -> None:
        line = f"[rank {rank} of {world}] {msg}"
        print(line, file=sys.stderr, flush=True)
        logs.put(line)

    env, store = _node_store()
    ref = spec.credential_ref or None
    exchange = RunExchange(spec.exchange_url, spec.run_id, spec.version_id, spec.progress_key)
    fetched = store.fetch(exchange.bundle_url, credential_ref=ref)
    snapshot = store.verify(fetched.path)
    scratch = Path(tempfile.mkdtemp(prefix=f"lithi-rank-{rank}-", dir=_scratch_root(env.home)))
    try:
        index = load_index(store, exchange, snapshot, scratch, ref)
        if index.digest != spec.index_sha256:
            raise ProgressError(
                f"{exchange.index_url}: the index is {index.digest}, the step was handed "
                f"{spec.index_sha256}"
            )
        device = choose_device(spec.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            process_group_backend(device),
            init_method=f"tcp://{master[0]}:{master[1]}",
            rank=rank,
            world_size=world,
        )
        log(
            f"on node {ray.get_runtime_context().get_node_id()[:12]} ({device}): bundle "
            f"{snapshot.identity.version_id} in this node's cache ({fetched.files_downloaded} "
            f"file(s) fetched), index {index.digest[:12]} verified"
        )
        cost = torch.tensor(
            [file_bytes_hashed(), ids_decoded(snapshot.identity.content_sha256)],
            dtype=torch.int64,
        )
        dist.all_reduce(cost)
        fs, progress_root = store.open_location(exchange.progress_url, ref)
        out = scratch / "out"
        with torch_threads(intra_op_threads(1, spec.num_workers)):
            summary = train_once(
                load_trainer(spec.trainer),
                index,
                json.loads(spec.config),
                out,
                rank=rank,
                world_size=world,
                num_workers=spec.num_workers,
                log=log,
                progress_dir=scratch / "progress",
                progress_mirror=CutMirror(fs, progress_root),
                checkpoint_every=spec.checkpoint_every,
                device=device,
            )
        result = None
        if summary is not None:  # rank 0
            url = exchange.attempt_url(spec.attempt)
            publish_outcome(store, url, out, summary, ref)
            hashed, decoded = (int(v) for v in cost.tolist())
            result = json.dumps(
                {"outcome_url": url, "ranks_bytes_hashed": hashed, "ranks_ids_decoded": decoded}
            )
        dist.barrier()
        dist.destroy_process_group()
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _node_store() -> tuple[Any, Any]:
    """This node's settings and bundle store: its own cache, its registered credential refs."""
    from resources.bundle_store import BundleStore
    from resources.credentials import CredentialRegistry
    from resources.settings import LithiEnv

    env = LithiEnv.load()
    return env, BundleStore(env.cache_path, CredentialRegistry(env.credential_ref_map))


def _scratch_root(home: Path) -> Path:
    root = home / "ray"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _claim(key: str, wait: float, log) -> Any:
    """The cluster-wide claim on the cuts named ``key``: a named actor this driver owns (Ray
    removes it when the driver exits, however it exits). While another fit holds it, wait up
    to ``wait`` seconds, then refuse naming the holder."""
    name = f"cuts-{key}"
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            claim = _Claim.options(
                name=name, namespace=CLAIM_NAMESPACE, num_cpus=0, scheduling_strategy=_here()
            ).remote()
            ray.get(claim.holder.remote())
            return claim
        except ValueError:  # the name is taken: another live fit holds these cuts
            try:
                holder = ray.get(
                    ray.get_actor(name, namespace=CLAIM_NAMESPACE).holder.remote(), timeout=10
                )
            except Exception:  # it went away meanwhile
                holder = "a fit that is ending"
            if time.monotonic() >= deadline:
                raise ProgressError(
                    f"cuts {key}: another fit holds them ({holder}) and did not let go within "
                    f"{wait:.0f} s; it must end before this one can resume them"
                ) from None
            if not told:
                log(f"cuts {key} are held by {holder}; waiting up to {wait:.0f} s")
                told = True
            time.sleep(1.0)


def _here() -> NodeAffinitySchedulingStrategy:
    """On the driver's own node: the claim and the log queue must outlive any worker node."""
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def _answers(actors: list[Any], wait: float) -> list[bool | None]:
    """Each of ``actors``' answer to a ping within ``wait`` seconds: ``True`` (placed, process
    and node up), ``False`` (it died: its node was lost, say) or ``None`` (no answer yet)."""
    pings = [a.node.remote() for a in actors]
    done, _ = ray.wait(pings, num_returns=len(pings), timeout=wait)
    answers: list[bool | None] = []
    for ping in pings:
        answer = None
        if ping in done:
            try:
                ray.get(ping)
                answer = True
            except ray.exceptions.RayError:
                answer = False
        answers.append(answer)
    return answers


def _answering(actors: list[Any], wait: float) -> list[bool]:
    """Which of ``actors`` answer a ping within ``wait`` seconds (placed, process and node up)."""
    return [answer is True for answer in _answers(actors, wait)]


def _place(want: int, options: dict[str, Any], wait: float) -> list[Any]:
    """Ask for ``want`` ranks spread over the nodes; those placed within ``wait`` seconds.

    A rank that dies before it answers is asked for again while time is left: right after a
    node is lost, Ray may still count it alive (until its health checks fail) and place a rank
    there, which then dies with the node's death; the next one goes to a node still up.
    """
    deadline = time.monotonic() + wait
    placed: list[Any] = []
    while len(placed) < want:
        asked = [
            Rank.options(**options, scheduling_strategy="SPREAD").remote()
            for _ in range(want - len(placed))
        ]
        answers = _answers(asked, max(0.0, deadline - time.monotonic()))
        for actor, answer in zip(asked, answers, strict=True):
            if answer:
                placed.append(actor)
            else:
                ray.kill(actor, no_restart=True)
        if None in answers or time.monotonic() >= deadline:
            break  # the wait is spent
    return placed


def _attempt(
    spec: RankSpec, actors: list[Any], logs: Queue, log, tether: Any
) -> tuple[dict[str, Any] | None, str | None]:
    """Run one attempt on ``actors``: (rank 0's result, None) or (None, why it failed)."""
    world = len(actors)
    master = ray.get(actors[0].address.remote())
    refs = [
        a.train.remote(asdict(spec), rank, world, master, logs) for rank, a in enumerate(actors)
    ]
    pending = list(refs)
    result: dict[str, Any] | None = None
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
        _drain(logs, log)
        if tether is not None:
            tether.check()  # raises once the step that waits for this job is gone
        for ref in done:
            try:
                value = ray.get(ref)
            except ray.exceptions.RayError as e:  # a rank failed or its node died
                return None, _first_line(e)
            if ref == refs[0]:
                result = json.loads(value)
    _drain(logs, log)
    return result, None


def _drain(logs: Queue, log) -> None:
    while not logs.empty():
        try:
            log(logs.get_nowait())
        except Exception:
            return


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    lines = [line for line in text if line.strip()]
    for line in reversed(lines):  # the innermost error names the cause
        if "Error" in line or "error" in line:
            return line.strip()[:300]
    return (lines[0] if lines else type(e).__name__)[:300]


def run(args: argparse.Namespace, log) -> dict[str, Any]:
    """Claim the cuts, then run attempts until one succeeds or the restarts are spent; the
    metadata the driver reports (rank 0's result, the shapes, the attempts)."""
    given = {f.name: getattr(args, f.name) for f in fields(RankSpec) if f.name != "attempt"}
    options: dict[str, Any] = {"num_cpus": args.cpus_per_worker, "max_restarts": 0}
    if args.gpus_per_worker:
        options["num_gpus"] = args.gpus_per_worker
    tether = _tether(args)
    claim = _claim(args.progress_key, args.claim_wait, log)
    logs = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": _here()})
    shapes: list[int] = []
    want = args.workers
    try:
        for attempt in range(args.max_restarts + 1):
            spec = RankSpec(**given, attempt=attempt)
            actors = _place(want, options, args.rank_wait)
            if attempt == 0 and len(actors) < args.workers:
                for a in actors:
                    ray.kill(a, no_restart=True)
                raise RuntimeError(
                    f"the Ray cluster placed {len(actors)} of {args.workers} workers "
                    f"({args.cpus_per_worker} CPU, {args.gpus_per_worker} GPU each) within "
                    f"{args.rank_wait:.0f} s"
                )
            if not actors:
                raise RuntimeError(f"attempt {attempt}: no node left to place a rank on")
            shapes.append(len(actors))
            log(f"attempt {attempt}: {len(actors)} rank(s) placed")
            try:
                result, failure = _attempt(spec, actors, logs, log, tether)
            except BaseException:
                for a in actors:
                    ray.kill(a, no_restart=True)
                raise
            alive = sum(_answering(actors, 10.0)) if result is None else len(actors)
            for a in actors:
                ray.kill(a, no_restart=True)
            if result is not None:
                return {**result, "world_size": len(actors), "attempts": attempt + 1,
                        "world_sizes": shapes}  # fmt: skip
            log(f"attempt {attempt} failed: {failure}")
            if attempt == args.max_restarts:
                raise RuntimeError(
                    f"training failed in {attempt + 1} attempt(s); the last: {failure}"
                )
            # The ranks that still answer are on nodes that are still there: go on with them.
            want = max(1, alive)
            lost = len(actors) - alive
            log(
                f"restarting from the last committed cut on {want} rank(s) ({lost} lost; "
                f"restart {attempt + 1} of {args.max_restarts})"
            )
        raise AssertionError("unreachable")
    finally:
        ray.kill(claim)


def _tether(args: argparse.Namespace) -> Any:
    """The heartbeat of the step that submitted this job, where it keeps one."""
    if not args.tether_url:
        return None
    from resources.run_exchange import Tether

    _, store = _node_store()
    return Tether(store, args.tether_url, args.tether_timeout, args.credential_ref or None)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeline.defs.ray_launch")
    p.add_argument("--exchange-url", required=True, help="the URL every node and the step reach")
    p.add_argument("--run-id", required=True)
    p.add_argument("--version-id", required=True, help="the bundle version published there")
    p.add_argument("--progress-key", required=True, help="the name of the fit's cuts")
    p.add_argument("--index-sha256", required=True, help="digest the index must have")
    p.add_argument("--trainer", required=True, help="import path of the Trainer (pkg.mod:Name)")
    p.add_argument("--config", required=True, help="the trainer's config as a JSON object")
    p.add_argument("--workers", type=int, required=True, help="ranks to place")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--device", default="auto")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between cuts")
    p.add_argument("--max-restarts", type=int, default=1, help="attempts after the first")
    p.add_argument("--cpus-per-worker", type=float, default=1.0)
    p.add_argument("--gpus-per-worker", type=float, default=0.0)
    p.add_argument("--credential-ref", default="", help="registered reference for the URL")
    p.add_argument("--rank-wait", type=float, default=RANK_WAIT)
    p.add_argument("--claim-wait", type=float, default=CLAIM_WAIT)
    p.add_argument("--tether-url", default="", help="the step's heartbeat: stop when it stops")
    p.add_argument("--tether-timeout", type=float, default=60.0, help="seconds of silence")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    ray.init(log_to_driver=False)  # the ranks' lines come through the queue, once
    from pipeline.defs.train_launch import launched_by_dagster

    if launched_by_dagster():
        from dagster_pipes import open_dagster_pipes

        with open_dagster_pipes() as pipes:
            result = run(args, pipes.log.info)
            pipes.report_asset_materialization(metadata=result)
    else:
        result = run(args, lambda m: print(m, file=sys.stderr, flush=True))
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
