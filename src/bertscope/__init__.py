"""bertscope: BERT's multi-head self-attention, from scratch, exact, visible and fast.

This module is the public API; everything re-exported here is stable.

    import bertscope
    bert = bertscope.load()                      # the bundled all-MiniLM-L6-v2, offline
    vecs = bert.embed(["a sentence", "another"])  # (2, 384) numpy, unit length
    probs = bertscope.load("fine-tuned/").classify(["a review"])  # (1, K), after bertscope finetune
    res = bertscope.attend(bert, "The animal didn't cross the street because it was too tired", "it")
    bertscope.trace(bert, "The cat sat because it was tired", "it", layer=3, head=1)  # the seed's steps
    bertscope.show(hf_outputs.attentions, tokens)  # any model's attention in the explorer
"""

from __future__ import annotations

__version__ = "0.1.0"

from .see.aggregate import attention_rollout, mean_heads
from .core.attention import AttentionRecord, MultiHeadSelfAttention, attention_reference
from .core.classifier import BertForSequenceClassification, ClassifierOutput
from .core.config import PRESETS, BertConfig, ConfigError
from .errors import BertscopeError, CheckpointError, InputError, InputTypeError, NonFiniteError
from .understand.inspect import AttendResult, attend, word_attention
from .bert import Bert, bundled_model_path, load
from .core.masks import mask_to_bias, to_key_padding_mask
from .core.model import BertModel
from .core.outputs import BertOutput
from .core.params import ParamCount, count_params
from .see.report import Report, ReportText, build_report
from .see.show import show
from .core.tokenizer import Batch, BertTokenizer, TruncationWarning
from .explain import Explanation, explain
from .understand.ablate import Ablation, ablate
from .understand.headstats import HeadStats, head_stats
from .understand.trace import Trace, trace

__all__ = [
    "AttendResult", "AttentionRecord", "Batch", "Bert", "BertConfig", "BertForSequenceClassification",
    "BertModel", "BertOutput", "ClassifierOutput",
    "BertTokenizer", "BertscopeError", "CheckpointError", "ConfigError", "InputError", "InputTypeError",
    "NonFiniteError",
    "MultiHeadSelfAttention", "PRESETS", "ParamCount", "TruncationWarning", "__version__",
    "attend", "attention_reference", "bundled_model_path", "count_params", "load",
    "mask_to_bias", "to_key_padding_mask", "word_attention",
    "Report", "ReportText", "attention_rollout", "build_report", "mean_heads", "show",
    "Explanation", "explain",
    "Ablation", "HeadStats", "Trace", "ablate", "head_stats", "trace",
]
