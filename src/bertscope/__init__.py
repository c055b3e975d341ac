"""bertscope: BERT's multi-head self-attention, from scratch, exact, visible and fast.

This module is the public API; everything re-exported here is stable.

    import bertscope
    bert = bertscope.load()                      # the bundled all-MiniLM-L6-v2, offline
    vecs = bert.embed(["a sentence", "another"])  # (2, 384) numpy, unit length
    probs = bertscope.load("fine-tuned/").classify(["a review"])  # (1, K), after bertscope finetune
    res = bertscope.attend(bert, "The animal didn't cross the street because it was too tired", "it")
    bertscope.trace(bert, "The cat sat because it was tired", "it", layer=3, head=1)  # the seed's steps
    bertscope.show(hf_outputs.attentions, tokens)  # any model's attention in the explorer

The names are imported on first use (PEP 562): ``import bertscope`` and ``bertscope --help`` do
not wait for torch's import.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Each public name and the module that defines it.
_HOME = {
    "attention_rollout": ".see.aggregate", "mean_heads": ".see.aggregate",
    "AttentionRecord": ".core.attention", "MultiHeadSelfAttention": ".core.attention",
    "attention_reference": ".core.attention",
    "BertForSequenceClassification": ".core.classifier", "ClassifierOutput": ".core.classifier",
    "PRESETS": ".core.config", "BertConfig": ".core.config", "ConfigError": ".core.config",
    "BertscopeError": ".errors", "CheckpointError": ".errors", "InputError": ".errors",
    "InputTypeError": ".errors", "NonFiniteError": ".errors",
    "AttendResult": ".understand.inspect", "attend": ".understand.inspect",
    "word_attention": ".understand.inspect",
    "Bert": ".bert", "bundled_model_path": ".bert", "load": ".bert",
    "mask_to_bias": ".core.masks", "to_key_padding_mask": ".core.masks",
    "BertModel": ".core.model", "BertOutput": ".core.outputs",
    "ParamCount": ".core.params", "count_params": ".core.params",
    "Report": ".see.report", "ReportText": ".see.report", "build_report": ".see.report",
    "show": ".see.show",
    "Batch": ".core.tokenizer", "BertTokenizer": ".core.tokenizer", "TruncationWarning": ".core.tokenizer",
    "Explanation": ".explain", "explain": ".explain",
    "Ablation": ".understand.ablate", "ablate": ".understand.ablate",
    "HeadStats": ".understand.headstats", "head_stats": ".understand.headstats",
    "Trace": ".understand.trace", "trace": ".understand.trace",
}
_PACKAGES = frozenset({"bench", "bert", "cli", "core", "errors", "explain", "fast", "files", "scale",
                       "see", "train", "understand"})

__all__ = [  # the names of _HOME (a test checks): written out for linters and `import *` readers
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

if TYPE_CHECKING:  # what type checkers and editors read; at run time the names come from _HOME
    from .bert import Bert, bundled_model_path, load
    from .core.attention import AttentionRecord, MultiHeadSelfAttention, attention_reference
    from .core.classifier import BertForSequenceClassification, ClassifierOutput
    from .core.config import PRESETS, BertConfig, ConfigError
    from .core.masks import mask_to_bias, to_key_padding_mask
    from .core.model import BertModel
    from .core.outputs import BertOutput
    from .core.params import ParamCount, count_params
    from .core.tokenizer import Batch, BertTokenizer, TruncationWarning
    from .errors import BertscopeError, CheckpointError, InputError, InputTypeError, NonFiniteError
    from .explain import Explanation, explain
    from .see.aggregate import attention_rollout, mean_heads
    from .see.report import Report, ReportText, build_report
    from .see.show import show
    from .understand.ablate import Ablation, ablate
    from .understand.headstats import HeadStats, head_stats
    from .understand.inspect import AttendResult, attend, word_attention
    from .understand.trace import Trace, trace


if not TYPE_CHECKING:  # hidden from type checkers, which then still flag a misspelt name
    def __getattr__(name: str):
        home = _HOME.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home, __name__), name)
            globals()[name] = value  # looked up once
            return value
        if name in _PACKAGES:  # `import bertscope; bertscope.core.model`, as before the names were lazy
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*__all__, *_PACKAGES, *(k for k in globals() if k.startswith("__"))})


_UNSET = object()  # explain not looked up yet (None is a value a caller may set)


class _Package(types.ModuleType):
    """``bertscope.explain`` is the function, though a subpackage has the same name: importing
    the subpackage binds it here (Python sets a package's attribute to each subpackage it
    loads), and this keeps the function in its place. Assigning another value (a test's patch)
    replaces it until deleted or assigned back, as for any other name."""

    @property
    def explain(self):
        value = self.__dict__.get("_explain", _UNSET)
        if value is _UNSET:
            from .explain import explain as value
            self.__dict__["_explain"] = value  # looked up once, as the other names are
        return value

    @explain.setter
    def explain(self, value) -> None:
        if not isinstance(value, types.ModuleType):
            self.__dict__["_explain"] = value

    @explain.deleter
    def explain(self) -> None:  # mock.patch's undo deletes what it set: the function comes back
        self.__dict__.pop("_explain", None)


sys.modules[__name__].__class__ = _Package
