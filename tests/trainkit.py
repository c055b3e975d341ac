"""Helpers for the fine-tuning tests: a tiny checkpoint folder and made-up labelled texts."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch

import bertscope
from bertscope.core.weights import to_hf_state_dict

POSITIVE = ["wonderful", "great", "superb", "delightful", "excellent", "brilliant", "lovely", "moving"]
NEGATIVE = ["awful", "terrible", "boring", "dreadful", "horrible", "dull", "painful", "weak"]
SUBJECTS = ["the film", "this movie", "the acting", "the story", "the ending", "the music", "the cast"]
TEMPLATES = ["{s} was {a}", "honestly, {s} was {a} from start to finish", "i thought {s} was {a}",
             "{s} felt {a} and i would say so again", "{a}. that is all i can say about {s}"]


def sentiment_rows(n: int, seed: int) -> list[dict]:
    """n made-up reviews, half "pos" and half "neg" (an easy task: the adjective decides)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 == 0 else "neg"
        adj = rng.choice(POSITIVE if label == "pos" else NEGATIVE)
        text = rng.choice(TEMPLATES).format(s=rng.choice(SUBJECTS), a=adj)
        rows.append({"text": text, "label": label})
    rng.shuffle(rows)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[dict], fields: tuple[str, ...] = ("text", "label")) -> Path:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for r in rows:
            w.writerow([r[k] for k in fields])
    return path


def tiny_checkpoint(folder: Path, bundled: Path, *, seed: int = 0, positions: int = 256,
                    dropout: float = 0.1) -> Path:
    """A small random BERT (hidden 32, 2 layers, 4 heads) with the bundled model's tokenizer,
    written as an HF-format folder."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = bertscope.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=positions,
                               hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    model = bertscope.BertModel(cfg)
    save_file(to_hf_state_dict(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": cfg.vocab_size,
              "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
              "hidden_act": "gelu", "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout,
              "max_position_embeddings": positions, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
              "pad_token_id": 0, "initializer_range": 0.02}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (bundled / name).is_file():
            shutil.copy(bundled / name, folder / name)
    return folder
