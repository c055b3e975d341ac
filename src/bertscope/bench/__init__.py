"""Benchmarks: bertscope side by side with other systems, and S13's cost against length.

    machine    what the machine is (CPU flags) and its measured matmul peak
    corpus     texts of exact lengths, a user's corpus, random-weight checkpoints
    systems/   one adapter per system compared (bertscope, sentence-transformers, HF, ONNX Runtime)
    timing     outputs compared, then medians over round-robin rounds
    scaling    S13: attention alone and the whole model against T
    report     Markdown tables and the S13 figure
    run        the whole run, as ``bertscope bench`` does it
    quality    the reduced-precision quality contract (cosine and top-10 overlap with fp32)
    doctor     the machine and the kernel choice measured on it, as ``bertscope doctor`` shows it
"""

from __future__ import annotations

from .report import plot_scaling, render_scaling_plot, systems_table, write_markdown
from .run import run_bench

__all__ = ["plot_scaling", "render_scaling_plot", "run_bench", "systems_table", "write_markdown"]
