"""BERT for sequence classification: the encoder, its pooler, dropout and one linear head.

Shape legend: B batch, T tokens, C hidden size, K labels (classes).

    h      = BertModel(input_ids)            (B, T, C)   the encoder (:mod:`bertscope.core.model`)
    pooled = tanh(W_p·h[:, 0] + b_p)         (B, C)      BERT's pooler, on the [CLS] token
    logits = W_c·Dropout(pooled) + b_c       (B, K)      the head
    loss   = mean cross-entropy(logits, labels)

This is how Devlin et al. (2019, "BERT", §4.1 and Figure 4) fine-tune BERT for single texts
and text pairs (a pair is one input, ``[CLS] A [SEP] B [SEP]``, with segment ids 0 for A and 1
for B). Parameter names and layout are Hugging Face's ``BertForSequenceClassification``: the
encoder under ``bert.``, the head as ``classifier.weight`` (K, C) and ``classifier.bias`` (K,).

For gradient attributions the head can be reached from three places: :meth:`forward` with
``inputs_embeds`` (word embeddings in place of ids), :meth:`logits_from_cls` (the last layer's
[CLS] vectors -> logits), and the encoder's own modules under :attr:`bert`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .config import BertConfig, ConfigError
from .model import BertModel, BertPooler
from .outputs import BertOutput

log = logging.getLogger(__name__)

__all__ = ["ARCHITECTURE", "BertForSequenceClassification", "ClassifierOutput"]

ARCHITECTURE = "BertForSequenceClassification"  # the name config.json's "architectures" holds


@dataclass(frozen=True)
class ClassifierOutput:
    """What :class:`BertForSequenceClassification` returns.

    logits:  (B, K) unnormalised scores; ``softmax(logits, -1)`` are the probabilities.
    loss:    () mean cross-entropy over the batch, when labels were given; else None.
    encoder: the encoder's :class:`~bertscope.core.outputs.BertOutput` (last hidden state,
             pooler output, and attentions, hidden states or intermediates when asked for).
    """

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    encoder: BertOutput | None = None


IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: a label that counts for nothing


def _check_labels(labels: object, batch: int, num_labels: int) -> torch.Tensor:
    """``labels`` as the loss takes them, else one InputError (one host sync): (B,) class indices
    0..K-1 of any integer dtype (-100, the loss's ignore_index, skips a text, as in HF), or (B, K)
    floats, each row a distribution over the classes (soft targets)."""
    if not isinstance(labels, torch.Tensor):
        raise InputError(f"labels must be a tensor of class indices, e.g. torch.tensor([0, 1]), "
                         f"got {type(labels).__name__}")
    if labels.is_floating_point():
        if tuple(labels.shape) != (batch, num_labels):
            raise InputError(f"float labels are class probabilities, shape ({batch}, {num_labels}); got "
                             f"{tuple(labels.shape)} (class indices are integers)")
        return labels
    if labels.is_complex() or labels.dtype == torch.bool:
        raise InputError(f"labels must be integer class indices, got {labels.dtype}")
    if tuple(labels.shape) != (batch,):
        raise InputError(f"labels must hold one class per text, shape ({batch},), got {tuple(labels.shape)}")
    bad = (labels < 0) & (labels != IGNORE_INDEX) | (labels >= num_labels)
    if bool(bad.any()):
        raise InputError(f"labels must be classes 0..{num_labels - 1} (or {IGNORE_INDEX} to skip a text), "
                         f"got {int(labels[bad][0])}")
    return labels.long()


class BertForSequenceClassification(nn.Module):
    """The encoder (``.bert``), then pooler -> dropout -> linear head (``.classifier``).

    Args:
        config: the encoder's :class:`BertConfig`.
        num_labels: K >= 2 classes.
        id2label: class index -> name (default "LABEL_0", "LABEL_1", ... as HF names them).
        classifier_dropout: dropout before the head; None = the config's hidden_dropout_prob
            (HF's rule for a config whose ``classifier_dropout`` is null).
        encoder: an existing :class:`BertModel` to use as ``.bert`` (its weights are shared,
            not copied); default: a new one with BERT's initialisation. One loaded without a
            pooler (a checkpoint saved without it) is given a new one, N(0, 0.02), with a
            warning logged: the caller's ``encoder`` gains it too, since it is the same module.

    The head is initialised as BERT's linears are: N(0, 0.02) weight, zero bias.
    """

    def __init__(self, config: BertConfig, num_labels: int = 2, *, id2label: dict[int, str] | None = None,
                 classifier_dropout: float | None = None, encoder: BertModel | None = None) -> None:
        super().__init__()
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 2:
            raise ConfigError(f"a classifier needs at least 2 labels, got {num_labels!r}")
        if id2label is None:
            id2label = {i: f"LABEL_{i}" for i in range(num_labels)}
        if sorted(id2label) != list(range(num_labels)):
            raise ConfigError(f"id2label must name the classes 0..{num_labels - 1}, got keys {sorted(id2label)}")
        if len(set(id2label.values())) != num_labels:
            raise ConfigError("id2label gives two classes the same name")
        p = config.hidden_dropout_prob if classifier_dropout is None else classifier_dropout
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"classifier_dropout must be in [0, 1), got {p}")
        self.config = config
        self.num_labels = num_labels
        self.id2label = {int(i): str(name) for i, name in sorted(id2label.items())}
        self.classifier_dropout = classifier_dropout
        self.bert = encoder if encoder is not None else BertModel(config)
        if self.bert.pooler is None:  # an encoder saved without one: a new pooler, trained with the head
            log.warning("the encoder has no pooler weights: the classifier's pooler starts from random "
                        "numbers (as HF's does) and is trained with the head")
            self.bert.pooler = BertPooler(config)
            nn.init.normal_(self.bert.pooler.dense.weight, mean=0.0, std=0.02)
            nn.init.zeros_(self.bert.pooler.dense.bias)
            like = next(self.bert.parameters())
            self.bert.pooler.to(device=like.device, dtype=like.dtype)
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, num_labels)  # (K, C)
        nn.init.normal_(self.classifier.weight, mean=0.0, std=0.02)
        nn.init.zeros_(self.classifier.bias)

    @property
    def labels(self) -> list[str]:
        """Class names in index order: column k of the logits is ``labels[k]``."""
        return [self.id2label[i] for i in range(self.num_labels)]

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in self.id2label.items()}

    def logits_from_cls(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        """The head on the last layer's [CLS] vectors: (B, C) -> (B, K) logits.

        pooler (tanh(W_p·h + b_p)), then :meth:`logits_from_pooled`. The packed training path
        calls this on the first token of each packed sequence; :meth:`forward` takes the
        encoder's own pooler output instead, the same numbers.
        """
        pooled = self.bert.pooler(cls_hidden[:, None, :])  # (B, 1, C) -> (B, C)
        return self.logits_from_pooled(pooled)  # (B, K)

    def logits_from_pooled(self, pooled: torch.Tensor) -> torch.Tensor:
        """Dropout and the classifier on pooled [CLS] vectors: (B, C) -> (B, K) logits."""
        return self.classifier(self.dropout(pooled))  # (B, C)@(C, K) -> (B, K)

    @staticmethod
    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of (B, K) logits against (B,) class indices (IGNORE_INDEX skips a
        text) or (B, K) class probabilities."""
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        head_mask: torch.Tensor | None = None,
        output_intermediates: bool = False,
    ) -> ClassifierOutput:
        """Classify a padded batch (the readable reference path).

        Args:
            input_ids: (B, T) token ids (or None with ``inputs_embeds``).
            attention_mask: (B, T), 1 = token, 0 = PAD.
            token_type_ids: (B, T) segment ids: 0 for the first text, 1 for the second of a pair.
            labels: (B,) class indices (-100 skips a text) or (B, K) class probabilities; when
                given the record carries the mean cross-entropy.
            inputs_embeds: (B, T, C) word embeddings used instead of looking up ``input_ids``.
            output_attentions, output_hidden_states, head_mask, output_intermediates: passed to
                the encoder (see :meth:`bertscope.core.model.BertModel.forward`).

        Returns:
            a :class:`ClassifierOutput` with (B, K) logits, the loss and the encoder's record.
        """
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions,
                        output_hidden_states, head_mask, output_intermediates=output_intermediates,
                        inputs_embeds=inputs_embeds)
        logits = self.logits_from_pooled(out.pooler_output)  # (B, C) -> (B, K)
        if labels is not None:
            labels = _check_labels(labels, logits.shape[0], self.num_labels)
        loss = None if labels is None else self.loss_fn(logits, labels.to(logits.device))
        return ClassifierOutput(logits=logits, loss=loss, encoder=out)
