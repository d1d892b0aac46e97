"""Mid-fit cuts mirrored to a URL (``pipeline.training.cut_mirror``): a fit on another machine,
with an empty disk of its own, resumes the last cut committed there, and only a committed one.

The mirror here is a local fsspec folder; the Ray tests (tests/integration/test_ray_cluster.py)
mirror to an S3 API across nodes that share no disk.
"""

from __future__ import annotations

import fsspec
import torch

from pipeline.training.cut_mirror import COMMITTED, CutMirror
from pipeline.training.progress import Progress


def _mirror(root) -> CutMirror:
    return CutMirror(fsspec.filesystem("file"), str(root))


def test_a_cut_saved_on_one_disk_resumes_from_the_mirror_on_another(tmp_path):
    mirror = _mirror(tmp_path / "url")
    first = Progress(tmp_path / "node-a", every=2, mirror=mirror)
    first.save(2, shared={"w": torch.ones(3)}, local={"rows": 5})
    first.save(4, shared={"w": torch.full((3,), 2.0)}, local={"rows": 9})
    # only the last committed cut is kept at the URL
    assert sorted(p.name for p in (tmp_path / "url").iterdir()) == [COMMITTED, "step-0000000004"]
    found = Progress(tmp_path / "node-b", every=2, mirror=mirror).load()
    assert found is not None and found.step == 4 and found.local == {"rows": 9}
    assert torch.equal(found.shared["w"], torch.full((3,), 2.0))


def test_a_part_pushed_without_its_commit_is_not_resumed(tmp_path):
    mirror = _mirror(tmp_path / "url")
    Progress(tmp_path / "node-a", every=1, mirror=mirror).save(1, shared={}, local={"at": 1})
    # a rank that died after pushing its part of step 2, before rank 0 committed it
    (tmp_path / "part").write_bytes(b"half")
    mirror.push(tmp_path / "part", "step-0000000002/rank-0.pt")
    found = Progress(tmp_path / "node-b", every=1, mirror=mirror).load()
    assert found is not None and found.step == 1 and found.local == {"at": 1}


def test_an_empty_mirror_resumes_nothing_and_a_finished_fit_clears_it(tmp_path):
    mirror = _mirror(tmp_path / "url")
    assert Progress(tmp_path / "node-a", every=1, mirror=mirror).load() is None
    progress = Progress(tmp_path / "node-a", every=1, mirror=mirror)
    progress.save(1, shared={}, local={})
    progress.clear()
    assert not (tmp_path / "url").exists() and not (tmp_path / "node-a").exists()
    assert Progress(tmp_path / "node-c", every=1, mirror=mirror).load() is None
