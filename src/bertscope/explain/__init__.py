"""Explaining what each token takes from the others: attention weights side by side with
norms, value zeroing, ALTI, rollout and gradients (``bertscope.explain(bert, text, method)``)."""

from __future__ import annotations

from .explanation import METHOD_INFO, METHODS, Explanation, check_method, explain, explain_batch, method_kind
from .gradients import Target, class_target, similarity_target

__all__ = ["METHODS", "METHOD_INFO", "Explanation", "Target", "check_method", "explain", "explain_batch",
           "class_target", "method_kind", "similarity_target"]
