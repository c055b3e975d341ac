"""bertscope in bf16 (``load(..., precision="bf16")``) where the CPU runs bf16 natively (AMX or
AVX512-BF16); elsewhere the benchmark reports why it was left out. Measured even where bf16 is
no faster than fp32 (``keep_precision=True``): the row then shows by how much, and its setup
note says that ``load`` would run fp32 there."""

from __future__ import annotations

import warnings

NAME = "bertscope bf16"
ORDER = 5
DEVICES = ("cpu",)
REDUCED = "bf16"


def build(setup):
    from ...bert import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reason is reported as the skip reason
        bert = load(setup.folder, precision="bf16", keep_precision=True)
    if bert.precision != "bf16":
        raise RuntimeError(bert.precision_note)
    run = lambda texts: bert.embed(texts)  # noqa: E731
    run.bert = bert
    return run
