"""ONNX Runtime: HF's model exported to ONNX and optimised by onnxruntime's transformer optimizer
(fused attention, SkipLayerNorm, bias + GELU). Batches of 32 texts sorted by length, the
favourable batching, as sentence-transformers does."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch

from . import pool_normalize

log = logging.getLogger(__name__)

NAME = "onnxruntime"
ORDER = 3
DEVICES = ("cpu",)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


FUSED_ATTENTION = {"Attention", "MultiHeadAttention"}  # the optimizer's fused attention ops


def export_optimized(folder: Path, workdir: Path) -> tuple[Path, object, object]:
    """Export the folder's model to ONNX (opset 17) and optimise it for BERT; (path, tokenizer, HF config)."""
    import transformers
    from onnxruntime.transformers import optimizer

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    workdir.mkdir(parents=True, exist_ok=True)
    raw, opt = workdir / "model.onnx", workdir / "model.opt.onnx"
    enc = tok(["a sample text", "another"], padding=True, return_tensors="pt")
    dyn = {n: {0: "batch", 1: "tokens"} for n in INPUTS}

    class Wrapper(torch.nn.Module):  # a plain 3-tensor signature for the exporter
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrapper(model), tuple(enc[k] for k in INPUTS), str(raw), input_names=list(dyn),
                          output_names=["last_hidden_state"],
                          dynamic_axes=dict(dyn, last_hidden_state={0: "batch", 1: "tokens"}),
                          opset_version=17, dynamo=False)
    cfg = model.config
    optimized = optimizer.optimize_model(str(raw), model_type="bert", num_heads=cfg.num_attention_heads,
                                         hidden_size=cfg.hidden_size)
    optimized.save_model_to_file(str(opt))
    ops = {node.op_type for node in optimized.model.graph.node}
    if not ops & FUSED_ATTENTION:  # onnxruntime 1.23.2 (the last for Python 3.10) leaves this graph's unfused
        import onnxruntime

        log.warning("ONNX Runtime %s's optimizer fused no attention in this model: its figures are those of "
                    "the unfused attention (1.32 fuses it)", onnxruntime.__version__)
    return opt, tok, cfg


def session_embedder(path: Path, tok, hidden: int, max_len: int, threads: int, profile_prefix: str | None = None):
    """An embed function over an ONNX file: sorted batches of 32, mean-pooled, unit length.

    ``profile_prefix``, given, turns on ONNX Runtime's own profiler (files named from it); the
    function's ``session`` attribute is the InferenceSession, whose ``end_profiling()`` writes them."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}

    def run(texts):
        texts = list(texts)
        counts = [len(e) for e in tok(texts, truncation=True, max_length=max_len)["input_ids"]]
        order = sorted(range(len(texts)), key=lambda i: -counts[i])
        out = np.zeros((len(texts), hidden), np.float32)
        for a in range(0, len(order), 32):
            idx = order[a:a + 32]
            e = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=max_len,
                    return_tensors="np")
            feed = {k: e[k].astype(np.int64) for k in INPUTS if k in names}
            h = sess.run(["last_hidden_state"], feed)[0]  # (B, T, C)
            out[idx] = pool_normalize(h, e["attention_mask"])
        return out

    run.session = sess
    return run


def build(setup):
    import onnxruntime  # noqa: F401  (a missing runtime is reported before the export)

    path, tok, cfg = export_optimized(setup.folder, setup.workdir)
    return session_embedder(path, tok, cfg.hidden_size, setup.max_len, setup.threads)
