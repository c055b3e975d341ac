"""bertscope in int8 (``load(..., precision="int8")``): the same packed path, int8 linears."""

from __future__ import annotations

NAME = "bertscope int8"
ORDER = 4
DEVICES = ("cpu",)
REDUCED = "int8"  # compared with bertscope fp32 by the quality contract, not by the 1e-5 check


def build(setup):
    from ...bert import load

    bert = load(setup.folder, precision="int8")
    run = lambda texts: bert.embed(texts)  # noqa: E731
    run.bert = bert  # the benchmark records its kernel choice and calibration
    return run
