"""Explaining what each token takes from the others: attention weights side by side with
norms, value zeroing, ALTI, rollout and gradients (``bertscope.explain(bert, text, method)``).

``bertscope.explain`` is that function, so import this package's modules with ``from``:
``from bertscope.explain import measures`` (``import bertscope.explain.measures as m`` finds
the function first and fails)."""

from __future__ import annotations

from .explanation import (MAP_METHODS, METHOD_INFO, METHODS, VALUE_ZEROING_MAX_TOKENS, Explanation, check_method,
                          explain, explain_batch, map_measures, measure_info, method_kind, method_tokens,
                          parse_measures)
from .gradients import Target, class_target, similarity_target

__all__ = ["MAP_METHODS", "METHODS", "METHOD_INFO", "VALUE_ZEROING_MAX_TOKENS", "map_measures", "measure_info",
           "parse_measures", "Explanation", "Target", "check_method", "explain", "explain_batch",
           "class_target", "method_kind", "method_tokens", "similarity_target"]
