"""Input attributions of one output: gradient × input and integrated gradients.

Shape legend:
    B  texts in the batch
    K  rows of one evaluation (B texts, or B texts × S interpolation steps)
    T  tokens
    C  hidden size

The input is each token's word embedding e_t (the row of the embedding table, before the
position and segment embeddings and the embedding LayerNorm are added); the output is one
number per text, F(e), from a :class:`Target`:

* :func:`similarity_target`: the cosine similarity of the text's sentence embedding (the mean
  of the last hidden state over real tokens, as sentence-transformers pools all-MiniLM-L6-v2)
  with a fixed second text's embedding.
* :func:`class_target`: a fine-tuned classifier's probability of one class per text (by
  default the class it predicts for the text), softmax of its head on the [CLS] vector.

Attribution of token t (summed over the C embedding dimensions; a word sums its sub-tokens):

    gradient × input (Shrikumar et al. 2017; Kindermans et al. 2016):
        a_t = Σ_c e_tc · ∂F/∂e_tc
    integrated gradients (Sundararajan et al. 2017), baseline e' = 0:
        a_t = Σ_c (e_tc − e'_tc) · ∫₀¹ ∂F/∂e_tc (e' + α(e − e')) dα

the integral by S-point Gauss–Legendre quadrature on [0, 1]. Integrated gradients is
complete: Σ_t a_t = F(e) − F(e') up to the quadrature error.

The forward hands e to the model as ``inputs_embeds`` (its own embedding module adds positions,
segments and its LayerNorm; no arithmetic is redone). It runs on the padded reference model or
on the packed fast path (``path="packed"``); tests hold the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..bert import Bert
from ..core.model import INFERENCE_WEIGHTS, evaluating
from ..core.tokenizer import TruncationWarning
from ..errors import InputError, as_whole_number, warn_caller
from ..fast.packing import masked_mean, pack, unpack

__all__ = ["GRAD_METHODS", "EmbeddingFunction", "Target", "class_target", "embedding_function", "grad_input",
           "integrated_gradients", "similarity_target"]

GRAD_METHODS = ("grad-input", "integrated-gradients")


@dataclass(frozen=True)
class Target:
    """One number per text from the encoder's last hidden state.

    name:  what it is, for people ("cosine similarity to 'A dog sleeps.'").
    score: (last_hidden_state (K, T, C), attention_mask (K, T)) -> (K,); row k of an
        evaluation is text k mod B of the batch explained.
    """

    name: str
    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def similarity_target(bert: Bert, text_b: str) -> Target:
    """F = cos(mean-pooled last hidden state, embedding of ``text_b``), text_b's embedding fixed.

    text_b's embedding is ``bert.embed``'s (cut at ``max_seq_length``), computed by the fp32
    reference encoder: under ``precision="int8"`` or ``"bf16"`` both texts are in fp32, as the
    gradients are."""
    b = bert.encode([text_b], max_length=bert.max_seq_length, warn=False)  # (1, T): as embed cuts it
    if b.truncated[0]:  # named: "the text" would read as the text explained
        warn_caller(f"the second text (text_b) is longer than {bert.max_seq_length} tokens and was truncated",
                    TruncationWarning)
    dev = bert.device
    with torch.no_grad(), evaluating(bert.encoder):
        hidden = bert.encoder(b.input_ids.to(dev), b.attention_mask.to(dev),
                              b.token_type_ids.to(dev)).last_hidden_state  # (1, T, C)
    other = torch.nn.functional.normalize(masked_mean(hidden.float(), b.attention_mask.to(dev))[0], dim=0)  # (C,)

    def score(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled = masked_mean(hidden, mask)  # (K, C)
        return torch.nn.functional.cosine_similarity(pooled, other.to(pooled.dtype)[None], dim=-1)  # (K,)

    short = text_b if len(text_b) <= 60 else text_b[:57] + "..."
    return Target(name=f"cosine similarity to {short!r}", score=score)


def class_target(bert: Bert, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 token_type_ids: torch.Tensor, label: int | str | None = None) -> Target:
    """F = p(class | text), a classifier's softmax probability, for a padded batch of B texts.

    label: a class index or name (``bert.labels``); None = each text's predicted class. For labels
    that are numbers ("1".."5" stars), an int that is also another class's label is refused as
    ambiguous: give the name, as a string.
    """
    if not bert.is_classifier:
        raise InputError("this model has no classification head: a class target needs a fine-tuned "
                         "classifier (bertscope finetune), or explain a similarity (text_b)")
    clf = bert.model
    names = bert.labels
    B = input_ids.shape[0]
    if label is None:
        with evaluating(clf), torch.no_grad():
            logits = clf(input_ids.to(bert.device), attention_mask.to(bert.device),
                         token_type_ids.to(bert.device)).logits  # (B, n_classes)
        classes = logits.argmax(-1)  # (B,)
    else:
        if isinstance(label, str):
            if label not in names:
                raise InputError(f"unknown class {label!r}; the classifier's classes are: {', '.join(names)}")
            index = names.index(label)
        else:  # an int, or numpy's or a 0-d tensor's, as every other index of the API takes
            index = as_whole_number(label)
            named = names.index(str(index)) if index is not None and str(index) in names else None
            if index is None or not 0 <= index < len(names):
                also = (f"; the label '{index}' is class {named}: give it as a string, {index!r} -> '{index}'"
                        if named is not None else "")
                raise InputError(f"class {label!r} does not exist (the classifier has classes "
                                 f"0..{len(names) - 1}, or their names: {', '.join(names)}){also}")
            if named is not None and named != index:  # labels that are numbers: which one is meant?
                raise InputError(f"class {index} is ambiguous: this classifier's labels are numbers, and the "
                                 f"label '{index}' is class {named} while class {index} is the label "
                                 f"'{names[index]}'; give the label's name as a string ('{index}' or "
                                 f"'{names[index]}')")
        classes = torch.full((B,), index, dtype=torch.long, device=bert.device)  # (B,)

    def score(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        K = hidden.shape[0]
        probs = torch.softmax(clf.logits_from_cls(hidden[:, 0]), dim=-1)  # (K, C) -> (K, n_classes)
        return probs.gather(1, classes.repeat(K // B)[:, None])[:, 0]  # (K,)

    which = "the predicted class" if label is None else f"class {names[int(classes[0])]!r}"
    if label is None and B == 1:
        which = f"the predicted class {names[int(classes[0])]!r}"
    return Target(name=f"probability of {which}", score=score)


@dataclass(frozen=True)
class EmbeddingFunction:
    """F as a function of the word embeddings, for one padded batch of B texts.

    inputs: (B, T, C) the texts' actual word embeddings (detached).
    forward: (K, T, C) -> (K,), K a multiple of B: row k is text k mod B with embeddings E[k]
        (the layout captum uses when it stacks the interpolation steps).
    """

    inputs: torch.Tensor
    forward: Callable[[torch.Tensor], torch.Tensor]
    mask: torch.Tensor


def embedding_function(bert: Bert, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       token_type_ids: torch.Tensor, target: Target, path: str = "padded") -> EmbeddingFunction:
    """F(E) for a padded batch, on the reference model (``"padded"``) or the fast path (``"packed"``)."""
    if path not in ("padded", "packed"):
        raise ValueError(f"path must be 'padded' or 'packed', got {path!r}")
    if any(p.is_inference() for p in bert.model.parameters()):  # torch: "cannot be saved for backward"
        raise InputError(INFERENCE_WEIGHTS + " (the gradient methods)")
    encoder = bert.encoder
    dev = bert.device
    ids, mask, types = input_ids.to(dev), attention_mask.to(dev), token_type_ids.to(dev)
    B, T = ids.shape
    with torch.no_grad():
        inputs = encoder.embeddings.word_embeddings(ids).detach()  # (B, T, C)

    def forward(E: torch.Tensor) -> torch.Tensor:
        K = E.shape[0]
        if K % B:
            raise ValueError(f"{K} rows of embeddings for a batch of {B} texts")
        reps = K // B
        mask_k, types_k = mask.repeat(reps, 1), types.repeat(reps, 1)  # (K, T)
        if path == "padded":
            hidden = encoder(None, mask_k, types_k, inputs_embeds=E).last_hidden_state  # (K, T, C)
        else:
            packed = pack(ids.repeat(reps, 1), mask_k, types_k)  # (N,) real tokens only
            words = E.reshape(K * T, -1)[packed.flat_index]  # (K·T, C) -> (N, C) in packed order
            x = bert.fast.encode(encoder, packed, inputs_embeds=words)  # (N, C)
            hidden = unpack(x, packed, K)  # (K, T, C), zeros at PAD
        return target.score(hidden, mask_k)  # (K,)

    return EmbeddingFunction(inputs=inputs, forward=forward, mask=mask)


def _gradient(fn: Callable[[torch.Tensor], torch.Tensor], E: torch.Tensor) -> torch.Tensor:
    """∂F_k/∂E_k for every row k (rows are independent texts): (K, T, C)."""
    E = E.detach().requires_grad_(True)
    with torch.enable_grad():
        out = fn(E)  # (K,)
        (grad,) = torch.autograd.grad(out.sum(), E)
    return grad


def grad_input(F: EmbeddingFunction) -> torch.Tensor:
    """Gradient × input per token, Σ_c e_tc ∂F/∂e_tc: (B, T), PAD positions 0."""
    g = _gradient(F.forward, F.inputs)  # (B, T, C)
    return (F.inputs * g).sum(-1) * F.mask.to(g.dtype)  # (B, T)


def integrated_gradients(F: EmbeddingFunction, steps: int = 50, max_tokens: int = 4096) -> torch.Tensor:
    """Integrated gradients from the all-zero baseline, ``steps``-point Gauss–Legendre: (B, T).

    The interpolated inputs e' + α_s(e − e') are evaluated ``max_tokens`` tokens at a time.
    """
    if steps < 1:
        raise ValueError("steps must be at least 1")
    x = F.inputs  # (B, T, C)
    B, T, _ = x.shape
    nodes, weights = np.polynomial.legendre.leggauss(steps)  # on [-1, 1]
    alphas = torch.tensor(0.5 * (nodes + 1.0), dtype=x.dtype, device=x.device)  # (S,) on [0, 1]
    w = torch.tensor(0.5 * weights, dtype=x.dtype, device=x.device)  # (S,), sum 1
    baseline = torch.zeros_like(x)  # (B, T, C)
    total = torch.zeros_like(x)  # (B, T, C)
    per_call = max(1, max_tokens // max(1, B * T))  # steps per call
    for start in range(0, steps, per_call):
        a = alphas[start:start + per_call]  # (S',)
        scaled = baseline[None] + a[:, None, None, None] * (x - baseline)[None]  # (S', B, T, C)
        g = _gradient(F.forward, scaled.reshape(-1, T, x.shape[-1]))  # (S'·B, T, C)
        total += (w[start:start + per_call, None, None, None] * g.view(len(a), B, T, -1)).sum(0)  # (B, T, C)
    return ((x - baseline) * total).sum(-1) * F.mask.to(x.dtype)  # (B, T)
