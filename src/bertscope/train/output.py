"""Write a fine-tuned classifier as a Hugging Face-format folder.

    DIR/config.json            the base model's config, plus architectures
                               ["BertForSequenceClassification"], id2label, label2id, problem_type
    DIR/model.safetensors      every weight under HF's names (bert.*, classifier.*)
    DIR/tokenizer.json, vocab.txt, special_tokens_map.json   copied from the base folder
    DIR/tokenizer_config.json  the base's, with model_max_length = the fine-tuning max_length

HF transformers' ``AutoModelForSequenceClassification.from_pretrained(DIR)`` and
``bertscope.load(DIR)`` both load it. Every file is written atomically.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.checkpoint import read_config_dict
from ..core.classifier import ARCHITECTURE, BertForSequenceClassification
from ..core.weights import to_hf_state_dict
from ..files import write_bytes_atomic, write_text_atomic

__all__ = ["TOKENIZER_FILES", "classifier_config", "save_classifier"]

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "special_tokens_map.json")


def classifier_config(base: dict, model: BertForSequenceClassification) -> dict:
    """The base folder's config.json dict, turned into the classifier's."""
    cfg = {k: v for k, v in base.items() if k not in ("_name_or_path",)}
    cfg.update(
        architectures=[ARCHITECTURE],
        model_type="bert",
        id2label={str(i): name for i, name in model.id2label.items()},
        label2id={name: i for i, name in model.id2label.items()},
        problem_type="single_label_classification",
        classifier_dropout=model.classifier_dropout,
    )
    return cfg


def save_classifier(out: Path, model: BertForSequenceClassification, base_folder: Path,
                    max_length: int) -> list[Path]:
    """Write ``model`` to ``out`` as an HF folder (see the module doc); returns the paths written."""
    from safetensors.torch import save

    out.mkdir(parents=True, exist_ok=True)
    written = [write_bytes_atomic(out / "model.safetensors", save(to_hf_state_dict(model), metadata={"format": "pt"}))]
    for name in TOKENIZER_FILES:
        src = base_folder / name
        if src.is_file():
            written.append(write_bytes_atomic(out / name, src.read_bytes()))
    tok_cfg: dict = {}
    src = base_folder / "tokenizer_config.json"
    if src.is_file():
        try:
            loaded = json.loads(src.read_text(encoding="utf-8"))
            tok_cfg = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            tok_cfg = {}
    tok_cfg["model_max_length"] = int(max_length)
    tok_cfg.setdefault("do_lower_case", model.config.do_lower_case)
    written.append(write_text_atomic(out / "tokenizer_config.json", json.dumps(tok_cfg, indent=2)))
    config = classifier_config(read_config_dict(base_folder), model)
    written.append(write_text_atomic(out / "config.json", json.dumps(config, indent=2, ensure_ascii=False)))
    return written
