"""bertscope: BERT's multi-head self-attention, from scratch, exact, visible and fast.

This module is the public API; everything re-exported here is stable.

    import bertscope
    bert = bertscope.load()                      # the bundled all-MiniLM-L6-v2, offline
    vecs = bert.embed(["a sentence", "another"])  # (2, 384) numpy, unit length
    res = bertscope.attend(bert, "The animal didn't cross the street because it was too tired", "it")
"""

from __future__ import annotations

__version__ = "0.1.0"

from .aggregate import attention_rollout, mean_heads
from .attention import AttentionRecord, MultiHeadSelfAttention, attention_reference
from .config import PRESETS, BertConfig, ConfigError
from .errors import BertscopeError, CheckpointError, InputError
from .inspect import AttendResult, attend, word_attention
from .loading import Bert, bundled_model_path, load
from .masks import mask_to_bias, to_key_padding_mask
from .model import BertModel
from .outputs import BertOutput
from .params import ParamCount, count_params
from .report import Report, ReportText, build_report
from .tokenizer import Batch, BertTokenizer, TruncationWarning

__all__ = [
    "AttendResult", "AttentionRecord", "Batch", "Bert", "BertConfig", "BertModel", "BertOutput",
    "BertTokenizer", "BertscopeError", "CheckpointError", "ConfigError", "InputError",
    "MultiHeadSelfAttention", "PRESETS", "ParamCount", "TruncationWarning", "__version__",
    "attend", "attention_reference", "bundled_model_path", "count_params", "load",
    "mask_to_bias", "to_key_padding_mask", "word_attention",
    "Report", "ReportText", "attention_rollout", "build_report", "mean_heads",
]
