"""Any model's attention in the explorer: ``bertscope.show(attentions, tokens)``.

Shape legend: N layers, B batch, H heads, T tokens (positions, padding included), U the tokens
given (U <= T).

The drop-in for bertviz's ``head_view``/``model_view``: attention tensors already in memory, for
example Hugging Face's ``model(..., output_attentions=True).attentions`` (a tuple of N tensors
(B, H, T, T)), become the same report ``bertscope view`` writes. It displays itself in Jupyter
and saves with ``.save("page.html")``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
import torch

from ..core.tokenizer import check_text
from ..errors import InputError, InputTypeError
from .aggregate import attention_rollout
from .report import Report, ReportText

__all__ = ["ROW_SUM_TOLERANCE", "show", "words_from_tokens"]

ROW_SUM_TOLERANCE = 1e-3  # attention rows (over the tokens given) must sum to 1 within this,
# or within twice the values' format's epsilon where that is wider (bfloat16: 0.0156; float16: 0.002)
_SPECIAL = re.compile(r"\[(CLS|SEP|PAD|MASK)\]|<s>|</s>|<pad>|<cls>|<sep>|<mask>|<\|endoftext\|>")


def words_from_tokens(tokens: Sequence[str]) -> tuple[list[str], list[int], list[bool]]:
    """Words from sub-tokens alone: WordPiece continues a word with "##"; SentencePiece ("▁")
    and byte-level BPE ("Ġ") mark a word's start. Special tokens ([CLS], </s>, ...) are words
    of their own. Returns the words, each token's word, and each token's special flag."""
    marker = next((m for m in ("▁", "Ġ") if any(t.startswith(m) for t in tokens)), None)
    words: list[str] = []
    token_words: list[int] = []
    special = [bool(_SPECIAL.fullmatch(t)) for t in tokens]
    for t, tok in enumerate(tokens):
        prev_ordinary = t > 0 and not special[t - 1]
        if special[t]:
            words.append(tok)
        elif tok.startswith("##") and prev_ordinary and len(tok) > 2:
            words[-1] += tok[2:]
        elif marker is not None and prev_ordinary and not tok.startswith(marker):
            words[-1] += tok
        else:
            words.append(tok[len(marker):] if marker and tok.startswith(marker) and len(tok) > len(marker) else tok)
        token_words.append(len(words) - 1)
    return words, token_words, special


def _as_array(x: Any, what: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    if x is None or isinstance(x, (str, bytes, dict)) or np.isscalar(x):  # np.asarray takes these as 0-d arrays
        raise InputTypeError(f"{what} is {type(x).__name__}, not an array of numbers")
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputTypeError(f"{what} is {type(x).__name__}, not an array of numbers") from None
    return arr


def _row_sum_tolerance(values: np.ndarray) -> tuple[float, str]:
    """How far from 1 a row may sum, from the values themselves: a softmax rounded to bfloat16 (8
    significant bits) sums to 1 only within about 2^-8 per row, and so it does after a cast to
    float32 or float64 (``a.float().numpy()``, since numpy has no bfloat16). Values that all fit
    in bfloat16 (or float16) are read as such; others get :data:`ROW_SUM_TOLERANCE`."""
    x = values.astype(np.float32)
    if not np.array_equal(x, values):  # finer than float32: not rounded to a short format
        return ROW_SUM_TOLERANCE, ""
    if np.array_equal(x, np.round(x)):  # whole numbers (integers given, or one-hot rows): no format
        return ROW_SUM_TOLERANCE, ""
    if not (x.view(np.uint32) & 0xFFFF).any():  # the low 16 bits of every float32 are 0
        return 2 * 2.0 ** -7, "bfloat16"  # twice bfloat16's epsilon
    with np.errstate(over="ignore"):
        if np.array_equal(x.astype(np.float16).astype(np.float32), x):
            return max(ROW_SUM_TOLERANCE, 2 * 2.0 ** -10), "float16"
    return ROW_SUM_TOLERANCE, ""


def _layers(attentions: Any) -> np.ndarray:
    """attentions in any of the accepted layouts -> (N, B, H, T, T) float64."""
    if isinstance(attentions, (list, tuple)):
        if not attentions:
            raise InputError("attentions is empty: give one (B, H, T, T) tensor per layer")
        layers = [_as_array(a, f"attentions[{i}]") for i, a in enumerate(attentions)]
        for i, a in enumerate(layers):
            if a.ndim not in (3, 4):
                raise InputError(f"attentions[{i}] has shape {a.shape}: each layer must be "
                                 "(B, H, T, T) or (H, T, T)")
            if a.shape != layers[0].shape:
                raise InputError(f"attentions[{i}] has shape {a.shape}, attentions[0] {layers[0].shape}: "
                                 "every layer must have the same shape")
        stacked = np.stack([a if a.ndim == 4 else a[None] for a in layers])  # (N, B, H, T, T)
    else:
        arr = _as_array(attentions, "attentions")
        if arr.ndim == 4:
            stacked = arr[:, None]  # (N, H, T, T) -> (N, 1, H, T, T)
        elif arr.ndim == 5:
            stacked = arr
        else:
            raise InputError(f"attentions has shape {arr.shape}: give a sequence of per-layer (B, H, T, T) "
                             "tensors (as Hugging Face's output_attentions), or one (N, H, T, T) array")
    N, B, H, T, T2 = stacked.shape
    if T != T2:
        raise InputError(f"attention maps must be square (T, T), got ({T}, {T2})")
    if min(N, B, H, T) < 1:
        raise InputError(f"attentions has an empty dimension: (layers, batch, heads, T, T) = {stacked.shape}")
    return stacked


PAD_TOKENS = ("[PAD]", "<pad>")  # BERT's, and RoBERTa's / T5's
MASKED = 1e-6  # the most attention a masked (padding) key gets from a real token: softmax of the dtype's minimum


def _tokens(tokens: Any, what: str) -> tuple[int, list[str]]:
    """(how many padding tokens lead, the tokens without the trailing padding): a padded batch's
    tokens, padded on the right (BERT's) or the left. Whether the leading ones are padding, the
    attention says (:func:`_text`): T5's decoder starts with ``<pad>`` as a real token."""
    if not isinstance(tokens, (str, list, tuple)) and callable(getattr(tokens, "tolist", None)):
        tokens = tokens.tolist()  # a numpy array or a pandas Series of strings, as embed takes texts
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise InputTypeError(f"{what} must be a list of token strings, got {type(tokens).__name__}")
    out = list(tokens)
    for i, t in enumerate(out):
        check_text(t, f"{what}[{i}]")  # a string, and valid Unicode: the page is written as UTF-8
    while out and out[-1] in PAD_TOKENS:  # the padding goes with its rows and columns
        out.pop()
    start = 0
    while start < len(out) and out[start] in PAD_TOKENS:  # padding_side="left", if masked
        start += 1
    if start == len(out):
        raise InputError(f"{what} is empty" if not tokens else f"{what} holds only padding")
    return start, out


def _text(att: np.ndarray, tokens: tuple[int, list[str]], what: str,
          tolerance: tuple[float, str] = (ROW_SUM_TOLERANCE, "")) -> ReportText:
    """One batch item (N, H, T, T) and (s, its U tokens) -> a ReportText over positions s..s+U-1.
    ``tolerance``: how far a row may sum from 1, and the input format that widened it (or "")."""
    s0, tokens = tokens
    if len(tokens) > att.shape[-1]:
        raise InputError(f"{what} has {len(tokens)} tokens but the attention maps are {att.shape[-1]} x {att.shape[-1]}")
    if s0:  # from the first leading one the tokens after them attend to: a real token (T5's decoder start)
        taken = np.nonzero(np.abs(att[:, :, s0:len(tokens), :s0]).max(axis=(0, 1, 2)) > MASKED)[0]
        s0 = int(taken[0]) if taken.size else s0
    tokens = tokens[s0:]
    U = len(tokens)
    a = att[:, :, s0:s0 + U, s0:s0 + U]  # (N, H, U, U): the padding before and after the tokens dropped
    if not np.isfinite(a).all():
        l, h, i, j = (int(x) for x in np.argwhere(~np.isfinite(a))[0])
        raise InputError(f"the attentions of {what} hold NaN or infinite values (first: layer {l}, head {h}, "
                         f"row {what}[{s0 + i}], column {what}[{s0 + j}]: {a[l, h, i, j]})")
    if a.min() < -1e-6 or a.max() > 1 + 1e-6:
        raise InputError(f"the attentions of {what} lie in {a.min():.3g}..{a.max():.3g}; "
                         "give probabilities (after the softmax), in 0..1")
    sums = a.sum(-1)  # (N, H, U)
    tol, fmt = tolerance
    bad = np.abs(sums - 1) > tol
    if bad.any():
        l, h, i = (int(x) for x in np.argwhere(bad)[0])
        raise InputError(
            f"in layer {l}, head {h}, the row of {what}[{s0 + i}] sums to {sums[l, h, i]:.4f} over the {U} "
            f"tokens given, not 1 (within {tol:.2g}{f' for {fmt} values' if fmt else ''}): the tokens "
            f"must be the positions the attention covers (padding, if any, before or after them)")
    words, token_words, special = words_from_tokens(tokens)
    a32 = np.clip(a, 0, 1).astype(np.float32)
    text = " ".join(w for w, s in zip(words, [any(special[t] for t, x in enumerate(token_words) if x == k)
                                               for k in range(len(words))]) if not s)
    return ReportText(text=text, tokens=tokens, words=words, token_words=token_words, special=special,
                      attentions=a32, rollout=attention_rollout(torch.from_numpy(a32)).numpy())


def show(attentions: Any, tokens: Sequence[str], *, tokens_b: Sequence[str] | None = None,
         model_name: str = "attention given to bertscope.show") -> Report:
    """The explorer for attention computed by any model.

    Args:
        attentions: per layer a (B, H, T, T) tensor (torch or numpy; e.g. Hugging Face's
            ``outputs.attentions``), or (H, T, T) per layer, or one (N, H, T, T) array. A single
            4-D array is always read as (N, H, T, T): pass one layer's (B, H, T, T) as ``[a]``.
            Rows are queries and must be probabilities (after the softmax).
        tokens: the token strings of the text, in order (e.g.
            ``tokenizer.convert_ids_to_tokens(ids)``): batch item 0, in a batch of one text (or
            of two, with ``tokens_b``; from a larger batch select one item, ``[a[i:i+1] for a in
            attentions]``). Positions after them are dropped as padding, and so are trailing
            ``[PAD]`` / ``<pad>`` tokens of the list itself, and leading ones (a batch padded on
            the left) that the tokens after them give no attention (masked): a leading ``<pad>``
            they attend to is a real token, as T5's decoder start is, and stays.
        tokens_b: the tokens of batch item 1, to show a second text beside the first with their
            difference (the batch must then hold exactly two items).

    Returns:
        a :class:`~bertscope.see.report.Report`: it displays itself in Jupyter, and
        ``.save("page.html")`` writes the self-contained explorer.

    Raises InputError (one sentence) for shapes that do not fit the tokens, values that are not
    probabilities, or rows that do not sum to 1 over the tokens given (within
    :data:`ROW_SUM_TOLERANCE`, or twice the values' format's epsilon where wider: 0.0156 for
    values that fit bfloat16, whose rounded softmax rows sum to 1 only within about 0.004, even
    after a cast to float32).
    """
    stacked = _layers(attentions)  # (N, B, H, T, T)
    N, B, H = stacked.shape[:3]
    toks = _tokens(tokens, "tokens")
    want = 1 if tokens_b is None else 2
    if B != want:
        if tokens_b is not None and not isinstance(attentions, (list, tuple)) and np.ndim(attentions) == 4:
            raise InputError("tokens_b needs a batch of 2 texts, but one 4-D array is read as (N, H, T, T), "
                             "a batch of 1: pass one layer's (B, H, T, T) as a list, [a]")
        if tokens_b is None:
            raise InputError(f"the attentions hold a batch of {B} texts: pass tokens_b for a second text, "
                             "or select one item, e.g. [a[i:i+1] for a in attentions]")
        raise InputError(f"tokens_b needs a batch of exactly 2 texts (A and B), the attentions hold {B}")
    tolerance = _row_sum_tolerance(stacked)
    texts = [_text(stacked[:, 0], toks, "tokens", tolerance)]
    if tokens_b is not None:
        texts.append(_text(stacked[:, 1], _tokens(tokens_b, "tokens_b"), "tokens_b", tolerance))
    return Report(model_name=model_name, num_layers=N, num_heads=H, texts=texts)
