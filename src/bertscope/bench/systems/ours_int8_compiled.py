"""bertscope in int8 with its steps compiled (``load(..., precision="int8", compile=True)``):
the int8 linears' quantize and epilogue steps, and the residual + LayerNorm between them, fused
by torch.compile. Left out of --quick runs: compiling takes about 30 s on a cold cache."""

from __future__ import annotations

NAME = "bertscope int8 compiled"
ORDER = 4.5
DEVICES = ("cpu",)
REDUCED = "int8"
QUICK = False  # too slow to build for a smoke run


def build(setup):
    from ...bert import load

    bert = load(setup.folder, precision="int8", compile=True, keep_precision=True)
    run = lambda texts: bert.embed(texts)  # noqa: E731
    run.bert = bert
    return run
