"""Shared fixtures. The bundled checkpoint is loaded once per test session."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The measured kernel choice is cached here, never in the user's own cache folder.
os.environ.setdefault("BERTSCOPE_CACHE_DIR", tempfile.mkdtemp(prefix="bertscope-test-cache-"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

IT_ANIMAL = "The animal didn't cross the street because it was too tired"


@pytest.fixture(scope="session")
def bert():
    """The bundled all-MiniLM-L6-v2, loaded by bertscope (eval mode, CPU, fp32)."""
    import bertscope

    return bertscope.load()


@pytest.fixture(scope="session")
def bundled_path(bert):
    return bert.path


@pytest.fixture(scope="session")
def hf_model(bundled_path):
    """HF transformers' BertModel on the same checkpoint, eager attention (the reference)."""
    import transformers  # a test dependency: a missing one must fail, not skip
    return transformers.BertModel.from_pretrained(str(bundled_path), attn_implementation="eager").eval()
