"""ONNX Runtime dynamic int8: the optimised ONNX model (as the fp32 competitor builds it)
quantized with ``onnxruntime.quantization.quantize_dynamic`` (int8 weights per channel,
activations quantized per tensor at run time), ONNX Runtime's recommended CPU int8 recipe."""

from __future__ import annotations

import logging

NAME = "onnxruntime int8"
ORDER = 6
DEVICES = ("cpu",)
REDUCED = "int8"


def export_int8(folder, workdir):
    """The folder's model exported and optimised as the fp32 competitor's, then quantized:
    (path of the int8 ONNX file, tokenizer, HF config)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .ort import export_optimized

    path, tok, cfg = export_optimized(folder, workdir)
    q = path.with_name("model.int8.onnx")
    # The optimizer's fused ops (Attention, SkipLayerNormalization, ...) carry no type
    # information for shape inference; their outputs are fp32.
    # ONNX Runtime logs "Please consider to run pre-processing" on the root logger, where the CLI
    # would print it as its own warning: its shape-inference pass changes nothing timed here
    advice = _DropAdvice()
    logging.getLogger().addFilter(advice)
    try:
        quantize_dynamic(str(path), str(q), per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        logging.getLogger().removeFilter(advice)
    return q, tok, cfg


class _DropAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def build(setup):
    from .ort import session_embedder

    q, tok, cfg = export_int8(setup.folder, setup.workdir / "ort-int8")
    return session_embedder(q, tok, cfg.hidden_size, setup.max_len, setup.threads)
