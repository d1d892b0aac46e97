"""The README's reader snippet runs as written, with only pyarrow, torch, numpy and pydantic."""

import re
import subprocess
import sys

import pyarrow as pa

from pipeline.bundle.stage import stage
from resources.settings import REPO_ROOT


def test_readme_reader_snippet_runs_without_dagster(tmp_path):
    text = (REPO_ROOT / "README.md").read_text()
    (snippet,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    bundle = tmp_path / "bundle"
    stage(
        pa.table(
            {"item_id": [f"{i:04d}" for i in range(100)], "x": [float(i) for i in range(100)]}
        ),
        bundle,
        id_field="item_id",
        kind="input",
        rows_per_part=30,
    )
    program = (
        "import sys\n"
        "class _NoDagster:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('dagster', 'dagster_pipes', 'assets', 'resources'):\n"
        "            raise ImportError(f'the reader core imported {name}')\n"
        "sys.meta_path.insert(0, _NoDagster())\n"
        + snippet.replace("path/to/bundle", str(bundle))
        + "ids = [i for batch in loader for i in batch['item_id']]\n"
        "assert sorted(ids) == [f'{i:04d}' for i in range(100)], ids\n"
        "print('ok', len(ids))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok 100"
