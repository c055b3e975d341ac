"""Layer x head heatmaps as PNG files. matplotlib is imported only when a function here runs.

Install it with the ``plot`` extra: ``pip install 'bertscope[plot]'``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

import torch

from .errors import InputError
from .files import write_bytes_atomic

__all__ = ["heatmap_png", "save_heatmap", "save_class_map"]


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("plots need matplotlib: pip install 'bertscope[plot]'") from None
    return plt


def heatmap_png(values: torch.Tensor, title: str, *, labels: Sequence[Sequence[str]] | None = None,
                cmap: str = "viridis", fmt: str = "{:.2f}", colorbar: bool = True,
                vmin: float | None = None, vmax: float | None = None) -> bytes:
    """A (N layers, H heads) heatmap with the value (or a label) written in each cell, as PNG bytes."""
    plt = _plt()
    N, H = values.shape
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * H, 0.9 + 0.45 * N))
    im = ax.imshow(values.float().numpy(), cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(range(H))
    ax.set_yticks(range(N))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    lo = float(values.min()) if vmin is None else vmin
    hi = float(values.max()) if vmax is None else vmax
    mid = (lo + hi) / 2
    for li in range(N):
        for hi_ in range(H):
            v = float(values[li, hi_])
            text = labels[li][hi_] if labels is not None else fmt.format(v)
            ax.text(hi_, li, text, ha="center", va="center", fontsize=6,
                    color="white" if v < mid else "black")
    if colorbar:
        fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def save_heatmap(path: str | Path, values: torch.Tensor, title: str, **kw) -> Path:
    return write_bytes_atomic(path, heatmap_png(values, title, **kw))


_SHORT = {"vertical": "V", "diagonal": "D", "vertical+diagonal": "V+D", "block": "B", "heterogeneous": "Het"}


def save_class_map(path: str | Path, classes: list[list[str]], order: Sequence[str], title: str) -> Path:
    """A map of the pattern class of every head (colour = class, label = short name)."""
    idx = torch.tensor([[order.index(c) for c in row] for row in classes], dtype=torch.float32)
    labels = [[_SHORT.get(c, c) for c in row] for row in classes]
    return save_heatmap(path, idx, title + "  (V vertical, D diagonal, B block, Het heterogeneous)",
                        labels=labels, cmap="Set3", colorbar=False, vmin=0, vmax=len(order) - 1)
