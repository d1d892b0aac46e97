"""A bundle source that tries to hang or exhaust the fetch or the sensor's bundle-URL client:
FIFOs, a manifest linked to ``/dev/zero``, a 1 GiB manifest, symlinked parts. Each is refused in
one line, within seconds and bounded memory, as ``verify`` refuses it; nothing enters the cache.

Every attempt runs in a child process with a time limit, so a regression shows as a failure,
not as a suite that never ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.bundle import format as fmt
from tests.helpers.bundles import make_input
from tests.helpers.timing import limit

ROOT = Path(__file__).resolve().parents[2]

CLIENTS = {
    "fetch": "from resources.bundle_store import BundleStore\nBundleStore(cache).fetch(url)",
    "sensor": "from resources.bundle_store import BundleStore\n"
    "from resources.compute.bundle_dir import BundleDirectory\n"
    "d = BundleDirectory(url, BundleStore(cache))\n"
    "d.status(d.job_id)",
}


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _link(target: str):
    def make(path: Path) -> None:
        path.unlink()
        os.symlink(target, path)

    return make


def _huge(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB that costs nothing on disk


REGULAR = "must be a regular file"
CASES = {
    "FIFO manifest": (fmt.MANIFEST_NAME, _fifo, REGULAR),
    "manifest linked to /dev/zero": (fmt.MANIFEST_NAME, _link("/dev/zero"), REGULAR),
    "1 GiB manifest": (fmt.MANIFEST_NAME, _huge, f"expected at most {fmt.MAX_MANIFEST_BYTES}"),
    "FIFO part": ("parts/part-00001.parquet", _fifo, "must be regular files"),
    "part linked to /dev/zero": ("parts/part-00001.parquet", _link("/dev/zero"), "symlink"),
    "part linked to /etc/passwd": ("parts/part-00001.parquet", _link("/etc/passwd"), "symlink"),
}
#: The sensor's client reads manifests only; the parts are the fetch's.
PAIRS = [(c, "fetch") for c in CASES] + [
    (c, "sensor") for c, (rel, _, _) in CASES.items() if rel == fmt.MANIFEST_NAME
]


def _run(client: str, bundle: Path, cache: Path) -> tuple[list[str], int]:
    """What the client said (its error, if any) and its peak memory in MiB, from a child."""
    code = f"url, cache = {str(bundle)!r}, {str(cache)!r}\n"
    code += "import resource, sys\ntry:\n    " + CLIENTS[client].replace("\n", "\n    ")
    code += "\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    code += "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=limit(60)
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines(), int(out.stderr.strip().splitlines()[-1]) // 1024


@pytest.mark.parametrize(("case", "client"), PAIRS)
def test_a_hostile_source_is_refused_quickly_in_one_line(tmp_path, case, client):
    rel, spoil, expected = CASES[case]
    make_input(tmp_path / "good")
    said, baseline_mib = _run(client, tmp_path / "good", tmp_path / "good-cache")
    assert said == []  # the same client on the intact bundle: no error, its memory the baseline
    make_input(tmp_path / "b")
    spoil(tmp_path / "b" / rel)
    said, peak_mib = _run(client, tmp_path / "b", tmp_path / "cache")
    assert len(said) == 1 and expected in said[0], said
    assert peak_mib < baseline_mib + 256, f"{peak_mib} MiB: the hostile file was read in memory"
    objects = tmp_path / "cache" / "objects"
    assert not objects.exists() or not any(objects.iterdir())
