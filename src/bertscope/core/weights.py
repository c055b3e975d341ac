"""Strict loading of Hugging Face-format BERT weights into :class:`bertscope.core.model.BertModel`.

The checkpoint's names follow HF's ``BertModel`` module tree; bertscope's tree is organised
around the seed (the attention module owns W_O). The map between the two is declared once,
below, as a table of patterns. Loading is strict: a missing, unexpected or mis-shaped weight,
or one holding NaN or infinity, raises :class:`~bertscope.errors.CheckpointError` naming the
key (and both shapes).

Both key layouts found in the wild load: bare (``encoder.layer.0...``, as saved by
``BertModel``) and prefixed (``bert.encoder.layer.0...``, as saved by ``BertForPreTraining``
and task models). In a prefixed checkpoint, the task heads outside ``bert.`` (``cls.*``,
``classifier.*``, ``qa_outputs.*``) are not part of the encoder and are set aside with a log
line; anything else unexpected is an error. A checkpoint saved without BERT's pooler (HF's
``BertForMaskedLM``, ``BertModel(add_pooling_layer=False)``) loads without one (a warning in the
log; ``pooler_output`` is None), where HF fills it with random numbers.

A sequence classifier (:class:`~bertscope.core.classifier.BertForSequenceClassification`,
whose parameters are ``bert.*`` and ``classifier.*``) loads strictly too: its encoder through
the same map, and ``classifier.weight`` / ``classifier.bias`` must be present with the right
shapes. :func:`to_hf_state_dict` is the way back, for writing a folder HF transformers loads.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from ..errors import CheckpointError

__all__ = ["CLASSIFIER_KEYS", "NAME_MAP", "convert_classifier_state_dict", "convert_state_dict", "count_non_finite",
           "load_state_dict_file", "load_weights", "to_checkpoint_name", "to_hf_state_dict", "POOLER_KEYS"]

log = logging.getLogger(__name__)

# checkpoint (HF) name pattern -> bertscope name pattern. {i} is the layer index.
NAME_MAP: list[tuple[str, str]] = [
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),
    ("embeddings.LayerNorm.{p}", "embeddings.norm.{p}"),
    ("encoder.layer.{i}.attention.self.query.{p}", "layers.{i}.attention.query.{p}"),
    ("encoder.layer.{i}.attention.self.key.{p}", "layers.{i}.attention.key.{p}"),
    ("encoder.layer.{i}.attention.self.value.{p}", "layers.{i}.attention.value.{p}"),
    ("encoder.layer.{i}.attention.output.dense.{p}", "layers.{i}.attention.output.{p}"),
    ("encoder.layer.{i}.attention.output.LayerNorm.{p}", "layers.{i}.attention_norm.{p}"),
    ("encoder.layer.{i}.intermediate.dense.{p}", "layers.{i}.feed_forward.dense_in.{p}"),
    ("encoder.layer.{i}.output.dense.{p}", "layers.{i}.feed_forward.dense_out.{p}"),
    ("encoder.layer.{i}.output.LayerNorm.{p}", "layers.{i}.output_norm.{p}"),
    ("pooler.dense.{p}", "pooler.dense.{p}"),
]

# Buffers some checkpoints carry that are not weights (recomputed on the fly here).
_IGNORED_BUFFERS = ("embeddings.position_ids",)
# Task heads outside the encoder in prefixed (``bert.``) checkpoints.
_HEAD_PREFIXES = ("cls.", "classifier.", "qa_outputs.")
# The classification head's parameters (the same names in HF and here).
CLASSIFIER_KEYS = ("classifier.weight", "classifier.bias")
# Old TF-converted checkpoints name LayerNorm parameters gamma/beta.
_LEGACY_SUFFIX = {"gamma": "weight", "beta": "bias"}


def _compile(pattern: str) -> re.Pattern[str]:
    rx = re.escape(pattern).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    return re.compile(rx + r"\Z")


_FORWARD = [(_compile(src), dst) for src, dst in NAME_MAP]
_BACKWARD = [(_compile(dst), src) for src, dst in NAME_MAP]


def _translate(name: str, table: list[tuple[re.Pattern[str], str]]) -> str | None:
    for rx, template in table:
        m = rx.match(name)
        if m:
            return template.format(**m.groupdict())
    return None


def to_checkpoint_name(name: str) -> str:
    """bertscope parameter name -> the HF checkpoint's name (for error messages and export).

    A classifier's names map too: ``bert.layers.0.attention.query.weight`` ->
    ``bert.encoder.layer.0.attention.self.query.weight``; ``classifier.*`` stay as they are.
    """
    if name in CLASSIFIER_KEYS:
        return name
    if name.startswith("bert."):
        return "bert." + to_checkpoint_name(name[len("bert."):])
    out = _translate(name, _BACKWARD)
    if out is None:
        raise KeyError(name)
    return out


def to_hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under HF's names (BertModel's, or BertForSequenceClassification's),
    detached, contiguous and on the CPU: what a model.safetensors for HF transformers holds."""
    return {to_checkpoint_name(k): v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read model.safetensors (preferred) or pytorch_model.bin; never executes pickled code."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or truncated files surface in many exception types
        raise CheckpointError(f"{path} could not be read as model weights ({type(e).__name__}: {e})") from None


POOLER_KEYS = ("pooler.dense.weight", "pooler.dense.bias")


def convert_state_dict(
    checkpoint: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], *, pooler_optional: bool = False
) -> dict[str, torch.Tensor]:
    """Rename a checkpoint's weights to bertscope's names and check them against ``expected``.

    Raises CheckpointError naming the first missing, unexpected or mis-shaped key. With
    ``pooler_optional``, a checkpoint without both pooler weights (saved from HF's
    ``BertForMaskedLM``, or ``BertModel(add_pooling_layer=False)``) converts without them.
    """
    prefixed = any(k.startswith("bert.") for k in checkpoint)
    converted: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    unexpected: list[str] = []
    set_aside: list[str] = []
    for key, tensor in checkpoint.items():
        name = key
        if prefixed:
            if not name.startswith("bert."):
                (set_aside if name.startswith(_HEAD_PREFIXES) else unexpected).append(key)
                continue
            name = name[len("bert."):]
        head, _, last = name.rpartition(".")
        if last in _LEGACY_SUFFIX:
            name = f"{head}.{_LEGACY_SUFFIX[last]}"
        if name in _IGNORED_BUFFERS:
            continue
        ours = _translate(name, _FORWARD)
        if ours is None or ours not in expected:
            unexpected.append(key)
            continue
        converted[ours] = tensor
        origin[ours] = key
    if set_aside:
        log.info("set aside %d task-head weights outside the encoder (e.g. %s)", len(set_aside), set_aside[0])
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise CheckpointError(f"unexpected weight {unexpected[0]!r} in checkpoint{more}")
    missing = [k for k in expected if k not in converted]
    if pooler_optional and sorted(missing) == sorted(POOLER_KEYS):
        missing = []
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"missing weight {to_checkpoint_name(missing[0])!r} "
            f"(expected shape {tuple(expected[missing[0]].shape)}){more}"
        )
    for name, tensor in converted.items():
        want = tuple(expected[name].shape)
        if tuple(tensor.shape) != want:
            raise CheckpointError(
                f"weight {origin[name]!r} has shape {tuple(tensor.shape)}, but the config needs {want}"
            )
        bad = count_non_finite(tensor)
        if bad:
            raise CheckpointError(f"weight {origin[name]!r} holds {bad:,} NaN or infinite value(s) "
                                  f"of {tensor.numel():,}; the checkpoint is damaged")
    return converted


def count_non_finite(tensor: torch.Tensor) -> int:
    """How many entries of a floating-point tensor are NaN or ±inf (0 for integer tensors)."""
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return 0
    return int((~torch.isfinite(tensor)).sum())


def convert_classifier_state_dict(
    checkpoint: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """:func:`convert_state_dict` for a sequence classifier: the encoder's weights (``bert.*``)
    through the name map, and the head's (``classifier.weight``, ``classifier.bias``) strictly.

    Raises CheckpointError naming a missing or mis-shaped head weight, or the first encoder
    weight that does not fit.
    """
    for key in CLASSIFIER_KEYS:
        if key not in checkpoint:
            raise CheckpointError(f"missing weight {key!r}: the config names a sequence classifier, "
                                  f"but the checkpoint has no classification head")
        want = tuple(expected[key].shape)
        if tuple(checkpoint[key].shape) != want:
            raise CheckpointError(f"weight {key!r} has shape {tuple(checkpoint[key].shape)}, but the "
                                  f"config needs {want} (hidden size x number of labels in id2label)")
    rest = {k: v for k, v in checkpoint.items() if k not in CLASSIFIER_KEYS}
    encoder_expected = {k[len("bert."):]: v for k, v in expected.items() if k.startswith("bert.")}
    converted = {"bert." + k: v for k, v in convert_state_dict(rest, encoder_expected).items()}
    converted.update({k: checkpoint[k] for k in CLASSIFIER_KEYS})
    return converted


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load a checkpoint file into ``model`` strictly (see :func:`convert_state_dict`; a model
    with a classification head: :func:`convert_classifier_state_dict`)."""
    checkpoint = load_state_dict_file(path)
    expected = model.state_dict()
    if all(k in expected for k in CLASSIFIER_KEYS):
        converted = convert_classifier_state_dict(checkpoint, expected)
    else:
        converted = convert_state_dict(checkpoint, expected, pooler_optional=True)
        if not any(k in converted for k in POOLER_KEYS) and getattr(model, "pooler", None) is not None:
            # what HF fills with random numbers (and warns about), bertscope leaves out: the
            # attention, the embeddings and the tools never use the pooler
            log.warning("%s has no pooler weights (saved without BERT's pooling layer, as HF's BertForMaskedLM "
                        "does): the model has no pooler, and its pooler_output is None", path)
            model.pooler = None
            expected = model.state_dict()
    with torch.no_grad():
        for name, tensor in converted.items():
            expected[name].copy_(tensor.to(expected[name].dtype))
