"""bertscope in int8 (``load(..., precision="int8")``): the same packed path, int8 linears.
Measured even where int8 is no faster than fp32 (``keep_precision=True``), so that the quality
contract is checked on every machine; the setup note then says ``load`` would run fp32 there."""

from __future__ import annotations

NAME = "bertscope int8"
ORDER = 4
DEVICES = ("cpu",)
REDUCED = "int8"  # compared with bertscope fp32 by the quality contract, not by the 1e-5 check


def build(setup):
    from ...bert import load

    bert = load(setup.folder, precision="int8", keep_precision=True)
    run = lambda texts: bert.embed(texts)  # noqa: E731
    run.bert = bert  # the benchmark records its kernel choice and calibration
    return run
