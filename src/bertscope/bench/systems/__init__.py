"""The systems a benchmark compares, one small adapter module each.

An adapter module defines ``NAME`` (as reported), ``ORDER`` (its place in tables), ``DEVICES``
(where it can run) and ``build(setup) -> Embedder``: a function from a list of texts to their
(N, C) float32 embeddings, mean-pooled and L2-normalised like bertscope's, so outputs can be
compared before anything is timed. A reduced-precision system sets ``REDUCED`` ("int8",
"bf16"): its outputs are held to the quality contract against bertscope fp32
(:mod:`bertscope.bench.quality`) instead of the fp32 systems' 1e-5. A system too slow to build
for a smoke run sets ``QUICK = False`` and is left out of quick runs. A competitor's library is
imported only inside ``build``; a missing one is reported and skipped. Adding a competitor is
adding one module here.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

__all__ = ["Embedder", "Setup", "adapters", "build_systems", "pool_normalize", "quiet_hub_progress",
           "reduced_systems"]

log = logging.getLogger(__name__)

Embedder = Callable[[Sequence[str]], np.ndarray]


@dataclass(frozen=True)
class Setup:
    """What every adapter gets: the checkpoint folder all systems load, bertscope's loaded model
    (for its max_seq_length), scratch space, threads, device and dtype."""

    folder: Path
    bert: object
    workdir: Path
    threads: int
    device: str = "cpu"
    dtype: torch.dtype | None = None

    @property
    def max_len(self) -> int:
        return self.bert.max_seq_length  # type: ignore[attr-defined]


def adapters() -> list:
    """Every adapter module in this package, in table order."""
    mods = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return sorted((m for m in mods if hasattr(m, "NAME")), key=lambda m: m.ORDER)


def reduced_systems() -> list[str]:
    """Names of the reduced-precision systems (held to the quality contract, not to 1e-5)."""
    return [m.NAME for m in adapters() if getattr(m, "REDUCED", None)]


def pool_normalize(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over real tokens, then unit length: (B, T, C) hidden states, (B, T) mask -> (B, C)."""
    m = mask[..., None].astype(np.float32)  # (B, T, 1)
    pooled = (h * m).sum(1) / np.clip(m.sum(1), 1e-9, None)  # (B, C)
    return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


@contextlib.contextmanager
def quiet_hub_progress() -> Iterator[None]:
    """No "Loading weights" / download progress bars from transformers and huggingface_hub while
    the competitors are built; the previous settings come back afterwards."""
    key = "HF_HUB_DISABLE_PROGRESS_BARS"
    env_before = os.environ.get(key)
    os.environ[key] = "1"
    hf_logging = None
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        pass
    was_on = hf_logging.is_progress_bar_enabled() if hf_logging is not None else False
    if hf_logging is not None:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if env_before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = env_before
        if hf_logging is not None and was_on:
            hf_logging.enable_progress_bar()


def build_systems(folder: Path, bert, workdir: Path, threads: int, device: str = "cpu",
                  dtype=None, only: Sequence[str] | None = None,
                  quick: bool = False) -> tuple[dict[str, Embedder], dict[str, str]]:
    """{name: embed function} for every system that can be built, and {name: why not} for the rest.
    bertscope is always built; ``only`` names the competitors wanted (default: all); ``quick``
    leaves out the systems that are slow to build (``QUICK = False``) unless ``only`` names them."""
    setup = Setup(Path(folder), bert, Path(workdir), threads, device, dtype)
    systems: dict[str, Embedder] = {}
    skipped: dict[str, str] = {}
    for mod in adapters():
        name = mod.NAME
        if name != "bertscope" and only is not None and name not in only:
            continue
        if device.split(":")[0] not in mod.DEVICES:
            skipped[name] = f"{'/'.join(d.upper() if d == 'cpu' else d for d in mod.DEVICES)} only in this benchmark"
            continue
        if quick and not getattr(mod, "QUICK", True) and not (only is not None and name in only):
            skipped[name] = "left out of --quick runs (slow to build)"
            continue
        try:
            with quiet_hub_progress():
                systems[name] = mod.build(setup)
        except ImportError as e:
            if name == "bertscope":
                raise
            skipped[name] = f"not installed ({e.name or e}; pip install 'bertscope[bench]' installs every competitor)"
        except Exception as e:  # a competitor that fails to build is reported, not fatal
            if name == "bertscope":
                raise
            skipped[name] = f"failed to build: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.debug("%s failed to build", name, exc_info=True)  # the caller reports skipped
    return systems, skipped
