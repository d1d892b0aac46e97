"""A picture for the UI: the loss curve as an SVG chart, inlined in the asset's metadata.

The SVG is written beside the checkpoint and shown inline on the asset page (a ``data:`` URI in
Markdown), so the curve is seen at a glance without opening a file.
"""

import base64
from pathlib import Path

from pipeline.bundle.atomic import atomic_write_text


def loss_svg(curve: list[float], path: Path, *, width: int = 480, height: int = 240) -> Path:
    """Write the loss curve as a small standalone SVG line chart and return its path."""
    pad = 36
    top = max(curve) if curve else 1.0
    n = max(len(curve) - 1, 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        x = pad + (width - 2 * pad) * i / n
        y = height - pad - (height - 2 * pad) * (v / top if top else 0)
        return x, y

    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(curve)))
    svg = f"""<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">
<rect width="100%" height="100%" fill="white"/>
<text x="{pad}" y="20" font-family="sans-serif" font-size="13">training loss by epoch</text>
<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>
<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>
<text x="4" y="{pad + 4}" font-family="sans-serif" font-size="10">{top:.3f}</text>
<text x="{width - pad}" y="{height - pad + 14}" font-family="sans-serif"
 font-size="10">{len(curve)}</text>
<polyline fill="none" stroke="#4f46e5" stroke-width="2" points="{points}"/>
</svg>
"""
    atomic_write_text(path, svg)
    return path


def svg_markdown(svg_path: Path, alt: str = "Training loss by epoch") -> str:
    """The SVG chart inlined as a Markdown image (a ``data:`` URI), which the Dagster UI renders."""
    data = base64.b64encode(svg_path.read_bytes()).decode("ascii")
    return f"![{alt}](data:image/svg+xml;base64,{data})"
