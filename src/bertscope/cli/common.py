"""Helpers shared by the commands."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

MODEL_HELP = ("a local Hugging Face-format BERT folder (config.json, model.safetensors or "
              "pytorch_model.bin, tokenizer.json or vocab.txt); default: the bundled all-MiniLM-L6-v2")


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", default=None, help=MODEL_HELP)


def load_model(args: argparse.Namespace):
    from ..bert import load

    return load(getattr(args, "model", None), precision=getattr(args, "precision", "fp32"))


def print_json(obj: Any) -> None:
    """Strict JSON on stdout (NaN/Infinity are refused before anything is written)."""
    from .guard import print_json_strict

    print_json_strict(obj)


def check_output_file(value: str, flag: str = "--out", suffixes: tuple[str, ...] = ()) -> Path:
    """Check an output FILE path before any work is done: right suffix, not a folder, and a
    folder to write it in that exists and is writable. Raises InputError (one line)."""
    import os

    from ..errors import InputError

    path = Path(value)
    if suffixes and path.suffix.lower() not in suffixes:
        raise InputError(f"{flag} must end in {' or '.join(suffixes)}, got {value!r}")
    if path.is_dir():
        raise InputError(f"{flag} {value!r} is a folder; give a file name")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{flag}: the folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{flag}: the folder {str(folder)!r} is not writable")
    from .guard import check_writable

    return check_writable(path, flag)  # as root, permission bits say yes even in /proc


def check_output_dir(value: str, flag: str = "--out") -> Path:
    """Check an output FOLDER path before any work is done: not a file, and creatable or writable.
    Raises InputError (one line)."""
    import os

    from ..errors import InputError

    path = Path(value)
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {value!r} is a file, not a folder")
    existing = path
    while not existing.exists():  # the nearest existing ancestor must be a writable folder
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{flag}: {str(existing)!r} is a file, so {value!r} cannot be a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{flag}: {str(existing)!r} is not writable")
    from .guard import check_writable

    return check_writable(path, flag, folder=True)
