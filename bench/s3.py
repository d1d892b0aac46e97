"""How fast ``BundleStore.fetch`` brings a bundle out of S3, against a plain parallel s3fs ``get``.

Starts moto's S3 server (the same fake the tests use) as a process of its own on 127.0.0.1,
uploads a bundle of at least 1 GB of incompressible random floats in parts of 24 MiB (built once
and cached under ``bench/out/``, with ``bench/verify.py``'s rows), then measures in interleaved
rounds:

* ``s3fs get x{files}``: ``S3FileSystem.get`` of every object of the bundle at once into a
  fresh folder — s3fs's own concurrent transfer, no checks at all (the baseline);
* ``s3fs get + fsync``: the same, then every file flushed to the disk (a reference: the fetch
  flushes each file before it trusts it, so the disk's rate bounds it too);
* ``BundleStore.fetch``: the project's fetch into a fresh cache — manifest read first and last,
  bounded memory, resumable partial files, every file sha256-checked, fsynced and recorded.

Both read the same objects from the same server in the same run, so the ratio is what the
fetch's guarantees cost against the client's raw speed (the target is >= 0.8). Each timing ends
when the download returns; what arrived is removed after it, untimed, for every method alike.
The server runs on the same cores as the client; its throughput bounds both.
Run: ``.venv/bin/python bench/s3.py [--gb 1.0] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import s3fs  # noqa: E402

from bench.verify import cached_bundle  # noqa: E402
from pipeline.bundle.digest import cpu_count  # noqa: E402
from pipeline.bundle.verify import verify  # noqa: E402
from resources.bundle_store import BundleStore, default_remote_workers  # noqa: E402

OUT = ROOT / "bench" / "out"
#: Part size: under s3fs's 50 MiB block, so its ``get`` streams each object in one GET as the
#: fetch does (larger objects it splits into concurrent ranged GETs, each of which moto's server
#: answers by reading the whole object: that would measure the fake, not the clients).
PART_BYTES = 24 * 1024 * 1024

KEY = SECRET = "bench"  # moto's server accepts any key unless IAM authentication is switched on


def wide_bundle(gb: float) -> Path:
    """The benchmark bundle (1 KB embedding rows in parts of ``PART_BYTES``), staged once."""
    return cached_bundle(OUT / f"s3-wide-{gb:g}gb", gb, "wide", part_bytes=PART_BYTES)


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in a process of its own; return it once it accepts connections."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("moto's server did not start") from None
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    """Upload the bundle, time both downloads, print the table; exit 1 under 1 GB."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="bundle size (default 1)")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved rounds (best is shown)")
    ap.add_argument(
        "--workers", type=int, help="downloads in flight for the fetch (default: the store's)"
    )
    args = ap.parse_args(argv)

    local = wide_bundle(args.gb)
    snap = verify(local)
    files = [local / e.path for e in snap.manifest.bound_files] + [local / "result-manifest.json"]
    total = sum(e.bytes for e in snap.manifest.bound_files)
    server, endpoint = start_server()
    os.environ["AWS_ENDPOINT_URL_S3"] = endpoint  # how the fetch, like a user, finds the store
    os.environ.setdefault("AWS_ACCESS_KEY_ID", KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET)
    try:
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key=KEY, secret=SECRET)
        fs.mkdir("bench")
        t = time.perf_counter()
        remote = [f"bench/bundle/{p.relative_to(local).as_posix()}" for p in files]
        fs.put([str(p) for p in files[:-1]], remote[:-1])
        fs.put_file(str(files[-1]), remote[-1])  # the manifest last, as every upload does
        print(f"uploaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        url = "s3://bench/bundle"
        scratch = Path(tempfile.mkdtemp(prefix="lithi-bench-s3-", dir=OUT))

        def s3fs_get() -> None:
            dest = scratch / "get"
            (dest / "parts").mkdir(parents=True)
            fs.get(remote, [str(dest / p.relative_to(local)) for p in files])

        def s3fs_get_fsync() -> None:
            dest = scratch / "get"
            (dest / "parts").mkdir(parents=True)
            targets = [dest / p.relative_to(local) for p in files]
            fs.get(remote, [str(t) for t in targets])
            for t in targets:  # what the fetch also does before it trusts a file
                with open(t, "rb") as f:
                    os.fsync(f.fileno())

        def fetch() -> None:
            cache = scratch / "cache"
            got = BundleStore(cache, remote_workers=args.workers).fetch(url)
            assert got.bytes_downloaded == total and got.manifest == snap.manifest

        methods = [
            (f"s3fs get x{len(files)} (baseline)", s3fs_get),
            ("s3fs get + fsync", s3fs_get_fsync),
            ("BundleStore.fetch", fetch),
        ]
        best = {name: float("inf") for name, _ in methods}
        for _ in range(args.repeat):
            for name, fn in methods:
                t = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t)
                # Removing what arrived is not part of any download: untimed, for each method
                # alike (deleting flushed files costs more than deleting ones still in memory).
                for d in scratch.iterdir():
                    shutil.rmtree(d)
        shutil.rmtree(scratch)
    finally:
        server.kill()
        server.wait()

    base = best[methods[0][0]]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"bundle: {total / 1e9:.2f} GB in {len(files) - 1} parts from moto's S3 server on "
        f"127.0.0.1; cpus: {cpu_count()}; fetch workers: "
        f"{args.workers or default_remote_workers()}; load avg {load:.1f}; best of {args.repeat}"
    )
    print(f"{'method':<30}{'seconds':>9}{'MB/s':>9}{'x baseline':>12}")
    for name, _ in methods:
        secs = best[name]
        print(f"{name:<30}{secs:>9.2f}{total / secs / 1e6:>9.0f}{base / secs:>12.2f}")
    return 0 if total >= 1e9 else 1


if __name__ == "__main__":
    sys.exit(main())
