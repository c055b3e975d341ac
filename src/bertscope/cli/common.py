"""Helpers shared by the commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

MODEL_HELP = ("a local Hugging Face-format BERT folder (config.json, model.safetensors or "
              "pytorch_model.bin, tokenizer.json or vocab.txt); default: the bundled all-MiniLM-L6-v2")


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", default=None, help=MODEL_HELP)


def load_model(args: argparse.Namespace):
    from ..loading import load

    return load(getattr(args, "model", None))


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
