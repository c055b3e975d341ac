"""The Bert facade: a loaded checkpoint, and the one place that picks the path a forward takes.

    bert = bertscope.load()                 # the bundled all-MiniLM-L6-v2, or load("folder")
    bert.model                              # the BertModel: the readable, padded reference path
    bert(input_ids, attention_mask)         # the same outputs, computed packed (no PAD arithmetic)
    bert.embed(["a text", ...])             # sentence embeddings on the packed path

    clf = bertscope.load("fine-tuned/")     # a folder whose config names BertForSequenceClassification
    clf.model                               # the BertForSequenceClassification (reference path)
    clf.encoder                             # its encoder, clf.model.bert (what embed, view... use)
    clf.classify(["a text", ...])           # (N, K) probabilities, columns named by clf.labels

``bert.model(...)`` is always the exact reference (it can return attentions, hidden states and
every intermediate). Plain forwards (``bert(...)``), ``embed`` and the embedding jobs take the
packed fast path (:mod:`bertscope.fast`), which the facade owns: its GEMM backend, caches,
kernel state and measured kernel choice live on ``bert.fast``. Arrows: this module uses fast
and core; they never use it.

Shape legend: N texts, B texts in one batch, T tokens, C hidden size, K classes; P the real
tokens of a packed batch (no PAD).

Precision (``load(..., precision=...)``, CPU only):

    "fp32"  the default: the packed path equals the reference within 1e-5
    "bf16"  the packed path's GEMMs in bfloat16 where the CPU has AMX or AVX512-BF16, the
            kernel choice measured them faster than fp32, and the calibration texts' sentence
            embeddings stay within BF16_BOUND of fp32; otherwise fp32, with a warning
    "int8"  the packed path's linears in int8 (:mod:`bertscope.fast.quant`): per-channel
            weights, per-token activations, the linears the calibration measures to break the
            bound kept fp32

``load(..., dtype=torch.bfloat16 or torch.float16)`` (for a GPU) casts the whole model instead;
``bert.precision`` then reads "bf16" or "fp16".

A reduced ``precision=`` changes only plain inference on the packed path (``embed``,
``bert(...)`` without extras, the embedding jobs). Anything that asks for attentions, hidden
states, head masks or intermediates (``view``, ``attend``, ``trace``...) runs ``bert.model``:
exactly the fp32 reference, whatever the precision. Under autograd the packed path is fp32 too.
``dtype=`` is not such a precision: it casts ``bert.model`` as well, so those tools then run in
that dtype (attention weights within about 1e-2 of fp32's in bfloat16).
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, ParamSpec, Sequence, TypeVar

import numpy as np
import torch

from .core.checkpoint import bundled_model_path, read_checkpoint
from .core.classifier import BertForSequenceClassification
from .core.config import BertConfig
from .core.model import BertModel, check_id_lists, check_tensor, evaluating
from .core.outputs import BertOutput
from .core.tokenizer import BertTokenizer, check_texts, least_read_length, tokenless, warn_truncated
from .errors import BertscopeError, InputError, InputTypeError, NonFiniteError, as_count, bad_whole, as_whole_number, setting, warn_caller
from .files import as_path
from .fast.batching import token_budget_batches
from .fast.encoder import PackedEncoder
from .fast.gemm import ONEDNN_REFUSALS, PRECISIONS, GemmBackend
from .fast.packing import masked_mean, mean_pool, pack_ids, sentence_means
from .fast.tuning import NOISE_MARGIN, busy_note, cpu_flags, threads_note

__all__ = ["BF16_BOUND", "Bert", "DEFAULT_BATCH_TOKENS", "PRECISIONS", "analysis", "bundled_model_path",
           "calibration_texts", "check_bert", "load"]

log = logging.getLogger(__name__)
_KEEP = setting("keep_precision=True", "--keep-precision")  # the CLI shows the flag alone


def _count(value: object, name: str) -> int | None:
    """None, or ``value`` as a whole number >= 1 (else an InputError, one line)."""
    return None if value is None else as_count(value, name)


def _check_progress(progress: object) -> None:
    """InputTypeError (one line) unless ``progress`` is None or a function: one that is not
    failed after the first batch's work, with Python's "'int' object is not callable"."""
    if progress is not None and not callable(progress):
        raise InputTypeError(f"progress must be a function of the number of texts done, got "
                             f"{type(progress).__name__}")


def _check_flag(value: object, name: str) -> None:
    """InputTypeError (one line) unless ``value`` is True or False (a string such as "no" is
    true to Python: it would be read as the opposite of what was meant)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{name} must be True or False, got {value!r}")


# Real tokens per batch in embed(), per device type: on CPU the (tokens, I) feed-forward
# activations should stay in cache; a GPU wants large batches. The measured kernel choice may
# override the CPU value per machine.
DEFAULT_BATCH_TOKENS = {"cpu": 2048, "cuda": 16384}
# bf16 runs only if the calibration texts' sentence embeddings keep this cosine to fp32: (mean, min).
BF16_BOUND = (0.999, 0.995)


def calibration_texts() -> list[str]:
    """The 63 English texts (1 to about 120 words) bertscope calibrates reduced precision on."""
    text = resources.files("bertscope.fast").joinpath("data/calibration.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


# what bert(...) passes on to the encoder's forward, beyond its three tensors
_FORWARD_OPTIONS = tuple(n for n in inspect.signature(BertModel.forward).parameters
                         if n not in ("self", "input_ids", "attention_mask", "token_type_ids"))


@dataclass
class Bert:
    """A loaded checkpoint: ``.config``, ``.model`` (eval mode), ``.tokenizer`` and ``.fast``.

    ``.model`` is a :class:`BertModel`, or for a fine-tuned classifier folder a
    :class:`~bertscope.core.classifier.BertForSequenceClassification`; ``.encoder`` is the
    :class:`BertModel` in both cases, and everything that reads attention or hidden states
    (embed, view, trace, heads...) uses it.
    """

    config: BertConfig
    model: BertModel | BertForSequenceClassification
    tokenizer: BertTokenizer
    path: Path | None = None
    max_seq_length: int = 512  # sentence-transformers' limit for embed(), when the folder sets one
    name: str = field(default="")
    fast: PackedEncoder = field(default_factory=lambda: PackedEncoder(tune=True), repr=False)
    precision: str = "fp32"  # what load() set the packed path to run in (see the module doc; a later
    # bert.model.to(dtype) casts the weights, and the repr says so)
    precision_note: str = ""  # why a requested reduced precision is off, or what calibration decided
    precision_asked: str = "fp32"  # what load() was asked for (``precision`` is what runs)
    int8_plan: object = field(default=None, repr=False)  # bertscope.fast.quant.Int8Plan in int8 mode

    def __repr__(self) -> str:  # a summary: the module tree is bert.model
        c = self.config
        kind = f"classifier {self.labels}" if self.is_classifier else "encoder"
        dtype = next(self.model.parameters()).dtype
        runs = self.precision
        if self.precision == "fp32" and dtype != torch.float32:  # bert.model.to(torch.bfloat16) after load
            runs = f"{str(dtype).replace('torch.', '')} weights"
        return (f"Bert({self.name or 'BERT'!r}, {kind}, {c.num_hidden_layers} layers x {c.num_attention_heads} heads, "
                f"hidden {c.hidden_size}, {runs} on {self.device}, path={str(self.path) if self.path else None!r})")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def encoder(self) -> BertModel:
        """The encoder: ``.model`` itself, or a classifier's ``.model.bert``."""
        return self.model.bert if isinstance(self.model, BertForSequenceClassification) else self.model

    @property
    def is_classifier(self) -> bool:
        return isinstance(self.model, BertForSequenceClassification)

    @property
    def labels(self) -> list[str] | None:
        """A classifier's class names (column k of :meth:`classify` is ``labels[k]``); else None."""
        return self.model.labels if isinstance(self.model, BertForSequenceClassification) else None

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None, **kwargs) -> BertOutput:
        """Encode a padded batch, as ``bert.encoder(...)`` does, on the fastest exact path.

        A plain forward (last hidden state and pooler) runs packed: no arithmetic on padding,
        PAD positions of ``last_hidden_state`` are zeros; it works under autograd and in
        training mode too. Asking for anything else (``output_attentions``,
        ``output_hidden_states``, ``head_mask``, ``output_intermediates``) runs the reference
        model, which can return it.
        """
        unknown = sorted(set(kwargs) - set(_FORWARD_OPTIONS))
        if unknown:  # a misspelt option, False, would otherwise be dropped in silence
            raise InputTypeError(f"bert() got unknown argument(s) {', '.join(unknown)}; it takes input_ids, "
                                 f"attention_mask, token_type_ids, {', '.join(_FORWARD_OPTIONS)}")
        for x, name in ((input_ids, "input_ids"), (attention_mask, "attention_mask"),
                        (token_type_ids, "token_type_ids")):
            check_tensor(x, name)
        if input_ids is None and kwargs.get("inputs_embeds") is None:
            raise InputTypeError("input_ids is required: (B, T) token ids; bert.encode(texts) gives a batch of them")
        dev = self.device
        args = tuple(None if t is None else t.to(dev) for t in (input_ids, attention_mask, token_type_ids))
        if any(v is not None and v is not False for v in kwargs.values()):
            return self.encoder(*args, **kwargs)
        if torch.is_grad_enabled() and self.encoder.embeddings.word_embeddings.weight.is_inference():
            with torch.no_grad():  # weights loaded in inference mode: no gradient to compute (see BertModel)
                return self.fast.forward(self.encoder, *args)
        return self.fast.forward(self.encoder, *args)

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
               max_length: int | None = None, *, warn: bool = True):
        """Tokenize texts for this model (see :meth:`BertTokenizer.encode`).

        Texts are cut to ``max_length`` tokens, by default the model's positions (512 for BERT),
        which is longer than the ``max_seq_length`` that :meth:`embed` cuts to (256 for the
        bundled all-MiniLM-L6-v2, as sentence-transformers does). To pool exactly what
        :meth:`embed` pools, pass ``max_length=bert.max_seq_length``. ``warn=False`` cuts
        without the :class:`TruncationWarning` (for a caller that warned already)."""
        return self.tokenizer.encode(texts, pairs=pairs, max_length=max_length, warn=warn)

    def embed(self, texts: Sequence[str], batch_size: int | None = None, normalize: bool = True,
              *, batch_tokens: int | None = None, progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Sentence embeddings (N, C): mean of the last hidden state over real tokens.

        Texts are sorted by length and packed into batches of at most ``batch_tokens`` real
        tokens (default: the batch size the kernel choice measured fastest on this machine, else
        DEFAULT_BATCH_TOKENS for the device) and at most ``batch_size`` texts,
        if given; the packed path computes nothing on padding. Rows come back in input order.
        With ``normalize`` each row has unit L2 norm (as all-MiniLM-L6-v2's card prescribes).
        An empty or whitespace-only text, or one of only characters the tokenizer drops (U+200B,
        control characters), gets a zero vector (as ``bertscope embed`` gives an empty line). Texts longer than the model's ``max_seq_length`` are cut, with a
        :class:`~bertscope.core.tokenizer.TruncationWarning`. A text that is not a string, or
        not valid Unicode, is an :class:`~bertscope.errors.InputError`.

        ``progress(n)`` is called after each batch with the number of texts it held, and once
        with the number of empty texts (their zero rows): the calls add up to ``len(texts)``, so
        ``tqdm(total=len(texts)).update`` is a progress bar. Batches run longest first (as
        sentence-transformers' ``encode`` does), so the count runs behind the time at first.

        The first call on a machine measures the fastest kernels for this model's shape (about
        2 s; cached, see ``bertscope doctor``).
        """
        batch_size, batch_tokens = _count(batch_size, "batch_size"), _count(batch_tokens, "batch_tokens")
        _check_flag(normalize, "normalize")
        _check_progress(progress)
        texts = check_texts(texts)
        real = [i for i, t in enumerate(texts) if t.strip()]
        ids, truncated = self.tokenizer.encode_ids([texts[i] for i in real], max_length=self.max_seq_length)
        warn_truncated(truncated, self.max_seq_length, real if len(texts) > 1 else None)
        # U+200B alone is empty too (a text that truncation cut that short is not)
        kept = [k for k, row in enumerate(ids) if not tokenless(row) or truncated[k]]
        real, ids = [real[k] for k in kept], [ids[k] for k in kept]
        out = np.zeros((len(texts), self.config.hidden_size), dtype=np.float32)
        if progress is not None and len(texts) > len(real):
            progress(len(texts) - len(real))  # the empty ones: done, zeros
        if real:
            out[real] = self.embed_ids(ids, batch_size=batch_size, normalize=normalize,
                                       batch_tokens=batch_tokens, progress=progress)
        return out

    def embed_ids(self, ids: Sequence[Sequence[int]], batch_size: int | None = None,
                  normalize: bool = True, *, batch_tokens: int | None = None,
                  progress: Callable[[int], None] | None = None) -> np.ndarray:
        """:meth:`embed` for texts already tokenized (lists of ids with [CLS] and [SEP]).

        Embedding is inference: the model runs in eval mode (no dropout), as
        sentence-transformers' ``encode`` does, and its mode is restored afterwards.
        ``progress(n)`` is called after each packed batch with the number of texts it held.
        Ids outside the vocabulary, or lists longer than the model's positions, are an
        InputError.
        """
        batch_size, batch_tokens = _count(batch_size, "batch_size"), _count(batch_tokens, "batch_tokens")
        _check_flag(normalize, "normalize")
        _check_progress(progress)
        check_id_lists(self.config, ids)
        ids = ids if isinstance(ids, list) else list(ids)  # rows by position (a Series indexes by label)
        C = self.config.hidden_size
        out = np.zeros((len(ids), C), dtype=np.float32)
        with evaluating(self.model), torch.inference_mode():
            choice = self.fast.prepare(self.encoder)  # measured once per machine and model shape
            if batch_tokens is None:
                batch_tokens = (choice.batch_tokens if choice is not None
                                else DEFAULT_BATCH_TOKENS.get(self.device.type, 2048))
            for idx in token_budget_batches([len(t) for t in ids], batch_tokens, batch_size):
                packed = pack_ids([ids[i] for i in idx], device=self.device)
                x = self.fast.encode(self.encoder, packed)  # (P, C) real tokens only
                pooled = mean_pool(x.float(), packed)  # (B, C), in packed order; fp32 sums in bf16/fp16 too
                if not bool(torch.isfinite(pooled).all()):  # never a NaN row that looks like a result
                    n_bad = int((~torch.isfinite(pooled).all(1)).sum())
                    raise NonFiniteError(
                        f"the model computed NaN or infinite values for {n_bad} text(s) in "
                        f"{x.dtype}; nothing was returned (check the weights, or use float32)")
                if normalize:
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)  # (B, C)
                rows = [idx[j] for j in packed.order]  # packed order -> input rows
                out[rows] = pooled.float().cpu().numpy()
                if progress is not None:
                    progress(len(idx))
        return out

    def classify(self, texts: Sequence[str], batch_size: int | None = None, *,
                 pairs: Sequence[str] | None = None, batch_tokens: int | None = None,
                 max_length: int | None = None) -> np.ndarray:
        """Class probabilities (N, K) of a fine-tuned classifier; column k is ``labels[k]``.

        Each text (or pair ``texts[i]``, ``pairs[i]``, segments 0 and 1) is cut to
        ``max_length`` tokens (default: the length the model was fine-tuned at, from its
        folder; at most its positions), with a :class:`TruncationWarning`. Texts run on the
        packed path, length-sorted in batches of at most ``batch_tokens`` real tokens and
        ``batch_size`` texts, in eval mode (no dropout); rows come back in input order.
        Raises InputError if the model has no classification head or a text is empty, and
        NonFiniteError if the model computes NaN or infinity (nothing is returned).
        """
        if not isinstance(self.model, BertForSequenceClassification):
            raise InputError("this model has no classification head (its config.json does not name "
                             "BertForSequenceClassification); fine-tune one with: bertscope finetune")
        texts = check_texts(texts)
        if pairs is not None:
            pairs = check_texts(pairs, "pairs")
            if len(pairs) != len(texts):
                raise InputError(f"texts and pairs differ in length ({len(texts)} and {len(pairs)})")
        empty = next((i for i, t in enumerate(texts)  # a pair with one side empty is read, as finetune reads it
                      if not t.strip() and (pairs is None or not pairs[i].strip())), None)
        if empty is not None:  # no neutral answer exists for a class (embed gives empty texts zeros)
            said = f"texts[{empty}] is" if pairs is None else f"texts[{empty}] and pairs[{empty}] are"
            raise InputError(f"{said} empty: a classifier has nothing to read (leave it out)")
        limit = self.max_seq_length if max_length is None else as_whole_number(max_length)
        low = least_read_length(pairs is not None)  # one token of each text besides the specials
        if limit is None or not low <= limit <= self.config.max_position_embeddings:
            raise bad_whole(limit, f"max_length must be a whole number {low}..{self.config.max_position_embeddings}"
                             f"{' for pairs' if pairs is not None else ''} (room for one token of each "
                             f"text), got {max_length!r}")
        ids, types, truncated = self.tokenizer.encode_segments(texts, pairs, max_length=limit)
        empty = next((i for i, row in enumerate(ids) if tokenless(row, pair=pairs is not None) and not truncated[i]),
                     None)
        if empty is not None:
            said = f"texts[{empty}] has" if pairs is None else f"texts[{empty}] and pairs[{empty}] have"
            raise InputError(f"{said} no tokens (only characters the tokenizer drops): a classifier has "
                             "nothing to read (leave it out)")
        warn_truncated(truncated, limit)
        return self.classify_ids(ids, types, batch_size=batch_size, batch_tokens=batch_tokens)

    def kernel_record(self) -> dict | None:
        """The kernel choice this model computes with here, as a job records it to be resumed
        with (:meth:`PackedEncoder.record`); made now if not yet (read from this machine's cache,
        or measured). None on a GPU."""
        return self.fast.record(self.encoder)

    def use_kernel_record(self, recorded: object, where: str) -> None:
        """Compute with a kernel choice a job recorded (:meth:`kernel_record`) from now on, so that
        its resumed rows are those an unstopped job computes (:meth:`PackedEncoder.restore`;
        ``where`` names the record's file). In int8 the calibration is made again when the int8
        kernel changes: which linears stay fp32 depends on the kernel's grid."""
        kernel = self.fast.gemm.int8_kernel
        if self.fast.restore(recorded, where) and self.fast.gemm.precision == "int8" \
                and self.fast.gemm.int8_kernel != kernel:
            from .fast.quant import calibrate

            self.int8_plan = calibrate(self.fast, self.encoder, _calibration_batch(self),
                                       kernel=self.fast.gemm.int8_kernel)

    def classify_ids(self, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None = None,
                     *, batch_size: int | None = None, batch_tokens: int | None = None) -> np.ndarray:
        """:meth:`classify` for texts already tokenized (ids with [CLS] and [SEP], and segments)."""
        if not isinstance(self.model, BertForSequenceClassification):
            raise InputError("this model has no classification head")
        batch_size, batch_tokens = _count(batch_size, "batch_size"), _count(batch_tokens, "batch_tokens")
        check_id_lists(self.config, ids)
        ids = ids if isinstance(ids, list) else list(ids)  # rows by position (a Series indexes by label)
        if type_ids is not None:
            check_id_lists(self.config, type_ids, "type_ids", vocab=self.config.type_vocab_size)
            type_ids = type_ids if isinstance(type_ids, list) else list(type_ids)
            if [len(t) for t in type_ids] != [len(t) for t in ids]:
                raise InputError("type_ids must hold one segment id per token of ids")
        if batch_tokens is None:
            batch_tokens = DEFAULT_BATCH_TOKENS.get(self.device.type, 2048)
        out = np.zeros((len(ids), self.model.num_labels), dtype=np.float32)
        with evaluating(self.model), torch.inference_mode():
            for idx in token_budget_batches([len(t) for t in ids], batch_tokens, batch_size):
                packed = pack_ids([ids[i] for i in idx], None if type_ids is None else [type_ids[i] for i in idx],
                                  device=self.device)
                logits = self.fast.classify(self.model, packed)  # (B, K) in packed order
                probs = torch.softmax(logits.float(), dim=-1)  # (B, K)
                if not bool(torch.isfinite(probs).all()):  # never a NaN row that looks like a result
                    n_bad = int((~torch.isfinite(probs).all(1)).sum())
                    raise NonFiniteError(f"the model computed NaN or infinite values for {n_bad} text(s); "
                                         "nothing was returned (check its weights" + (
                                             ", or load it in float32)" if next(self.model.parameters()).dtype != torch.float32
                                             else ")"))
                out[[idx[j] for j in packed.order]] = probs.cpu().numpy()
        return out

    def pool(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             token_type_ids: torch.Tensor | None = None, normalize: bool = True) -> torch.Tensor:
        """Mean-pooled (and optionally L2-normalised) sentence vectors (B, C) for one batch
        (``attention_mask`` None: every token is real). For :meth:`embed`'s vectors, encode with
        ``max_length=bert.max_seq_length``."""
        check_tensor(input_ids, "input_ids")
        check_tensor(attention_mask, "attention_mask")
        _check_flag(normalize, "normalize")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.to(self.device)
        h = self(input_ids, mask, token_type_ids).last_hidden_state  # (B, T, C)
        pooled = masked_mean(h, mask)  # (B, C)
        if normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)  # (B, C)
        return pooled


P = ParamSpec("P")
R = TypeVar("R")


def check_bert(bert: object, what: str) -> Bert:
    """``bert`` if it is a loaded :class:`Bert`; else InputTypeError naming ``what`` took it (a
    raw BertModel, say ``bert.model``, has no tokenizer to read a text with)."""
    if not isinstance(bert, Bert):
        raise InputTypeError(f"{what} takes a loaded model, bertscope.load(...), not {type(bert).__name__}")
    return bert


def analysis(fn: Callable[P, R]) -> Callable[P, R]:
    """For functions whose first argument is a :class:`Bert` and that read the model: the model
    runs in eval mode (dropout off; its mode restored afterwards) and without gradients. Tensors
    they return are ordinary ones (``torch.no_grad``, not inference mode), so a user may change
    them in place or use them in an autograd computation."""
    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        bert = check_bert(args[0] if args else kwargs.get("bert"), f"{fn.__name__}()")
        with evaluating(bert.model), torch.no_grad():
            return fn(*args, **kwargs)
    return run


BUNDLED_NAME = "all-MiniLM-L6-v2"


def _model_name(folder: Path, bundled: bool) -> str:
    """What reports call the model: the bundled checkpoint by its name, however it was reached
    (load() or its folder's path: one model, one name), else its folder's name."""
    if bundled:
        return BUNDLED_NAME
    try:
        if folder.resolve() == bundled_model_path().resolve():
            return BUNDLED_NAME
    except (OSError, BertscopeError):  # the bundled model not installed: this is another
        pass
    return folder.name


def load(path: str | Path | None = None, *, device: str | torch.device = "cpu",
         dtype: torch.dtype | None = None, precision: str = "fp32", compile: bool = False,
         keep_precision: bool = False) -> Bert:
    """Load a checkpoint folder (or, with ``path=None``, the bundled all-MiniLM-L6-v2).

    ``precision`` ("fp32", "bf16" or "int8"; CPU only) is what the packed path computes in
    (see the module doc); "bf16" and "int8" calibrate on :func:`calibration_texts` while
    loading (and measure the kernel choice, about 2 s, once per machine and model shape).
    ``compile=True`` (int8) also races the int8 steps compiled by ``torch.compile``: about 30 s
    more the first time on a machine, kept only if faster (:mod:`bertscope.fast.quant`).

    A reduced precision stays on only where it measures faster than fp32 here, by more than
    the noise margin: bf16's GEMMs against fp32's, and int8's calibrated plan against fp32 on
    the whole model (on a CPU whose int8 GEMM lacks VNNI it can be the slower). Where it does
    not, the model runs fp32 and a RuntimeWarning says why (``.precision_note``); the verdict is
    cached with the kernel choice. ``keep_precision=True`` keeps the precision asked for anyway
    (to study its numerics, or to benchmark it); quality bounds are never waived.

    ``device``: "cpu" (the default) or "cuda" / "cuda:N" where torch has CUDA. ``dtype``: None
    (the checkpoint's float32), torch.float32, torch.bfloat16 or torch.float16 for the whole
    model: how to run reduced precision on a GPU (on a CPU, ``precision`` is the fast way).

    Raises :class:`~bertscope.errors.CheckpointError` with one clear sentence when the folder
    is missing, is not a checkpoint, or its weights do not match its config; InputError for a
    precision, device or dtype that cannot be used as asked.
    """
    if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise InputError(f"dtype must be None, torch.float32, torch.bfloat16 or torch.float16, not {dtype!r}")
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if compile and precision != "int8":
        raise InputError(f"compile=True applies to precision='int8' only, not {precision!r}")
    if keep_precision and precision == "fp32":
        raise InputError("keep_precision=True applies to precision='int8' or 'bf16' only")
    if precision != "fp32":
        if _device_type(device) not in (None, "cpu"):
            raise InputError(f"precision {precision!r} is a CPU mode; on a GPU load with dtype=torch.bfloat16")
        if dtype not in (None, torch.float32):
            raise InputError(f"precision {precision!r} works on an fp32 model; do not also give dtype={dtype}")
    device = _check_device(device)
    folder = bundled_model_path() if path is None else as_path(path, "the model folder").expanduser()
    with torch.random.fork_rng(devices=[]):  # building the modules draws initial weights: not the caller's
        ck = read_checkpoint(folder, device=device, dtype=dtype)
    bert = Bert(config=ck.config, model=ck.model, tokenizer=ck.tokenizer, path=folder,
                max_seq_length=ck.max_seq_length, name=_model_name(folder, path is None),
                fast=PackedEncoder(gemm=GemmBackend(precision=precision, compile=compile), tune=True),
                precision_asked=precision)
    if dtype in (torch.bfloat16, torch.float16):  # the whole model, weights and all, in that dtype
        bert.precision = bert.precision_asked = "bf16" if dtype == torch.bfloat16 else "fp16"
        bert.precision_note = f"the whole model in {dtype} (dtype={dtype})"
    if precision == "int8":
        _calibrate_int8(bert, keep_precision)
    elif precision == "bf16":
        _check_bf16(bert, keep_precision)
    return bert


def _device_type(device: object) -> str | None:
    try:
        return torch.device(device).type  # type: ignore[arg-type]
    except (RuntimeError, TypeError, ValueError):
        return None


def _check_device(device: object) -> torch.device:
    """``device`` as a torch.device this torch can use, or InputError (one line)."""
    try:
        dev = torch.device(device)  # type: ignore[arg-type]
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), not {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r}: this torch has no CUDA device ({torch.__version__}); "
                             "use device='cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"device {device!r}: there are {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise InputError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), not {device!r}")
    return dev


def _calibration_batch(bert: Bert):
    ids, _ = bert.tokenizer.encode_ids(calibration_texts(), max_length=bert.max_seq_length)
    return pack_ids(ids, device=bert.device)


def _calibrate_int8(bert: Bert, keep_precision: bool = False) -> None:
    """int8 mode: pick the integer GEMM by measurement, decide which linears stay fp32, then
    keep int8 only if that plan measures faster than fp32 here (or ``keep_precision``)."""
    from .fast.quant import COMPILED_KERNEL, FP32_CHANNELS, FULL_LEVELS, INT8_KERNELS, calibrate, int8_kernel_available

    usable = [k for k in INT8_KERNELS if int8_kernel_available(k)]
    if not usable:
        raise InputError("precision 'int8' needs an int8 GEMM that this torch lacks on this CPU "
                         f"(tried {', '.join(INT8_KERNELS)}); use precision='fp32'")
    with torch.inference_mode():
        choice = bert.fast.prepare(bert.encoder)
    chosen = choice.int8_kernel if choice is not None else None
    ok = chosen in usable or (chosen == COMPILED_KERNEL and "onednn" in usable)
    kernel = chosen if ok else usable[0]
    bert.fast.gemm.int8_kernel = kernel
    packed = _calibration_batch(bert)
    plan = bert.int8_plan = calibrate(bert.fast, bert.encoder, packed, kernel=kernel)
    levels = bert.fast.gemm.int8_levels(kernel)
    kept = len(plan.keep_fp32)
    bits = "" if levels == FULL_LEVELS else ", 7-bit activations: this CPU's int8 GEMM saturates on 8-bit ones"
    what = (f"int8 ({kernel} kernel{bits}); {kept} of {len(plan.errors)} linears kept fp32, and "
            f"{FP32_CHANNELS} input channels of each int8 one")
    plan_key = (f"{kernel}, {levels} levels, fp32: {' '.join(plan.keep_fp32_names()) or 'none'}, "
                f"{FP32_CHANNELS} fp32 channels")
    speedup, busy = _int8_speedup(bert, choice, packed, plan_key)
    busy = f"; {busy}" if busy else ""  # a race that timed other work too is not cached
    speed = "" if speedup is None else f"; {speedup:.2f}x the speed of fp32 on the calibration texts{busy}"
    if speedup is not None and speedup < 1 + NOISE_MARGIN:
        if not keep_precision:
            bert.fast.gemm.precision = "fp32"
            bert.precision_note = (f"int8 is off: measured {speedup:.2f}x the speed of fp32 here ({what}{busy}); "
                                   f"running fp32 ({_KEEP} keeps int8)")
            warn_caller(f"bertscope: {bert.precision_note}", RuntimeWarning)
            return
        speed += f" (no faster: kept as asked, {_KEEP})"
    bert.precision = "int8"
    bert.precision_note = (f"{what}; calibration cosine to fp32 {plan.cosine_mean:.4f} mean, "
                           f"{plan.cosine_min:.4f} min{speed}")


def _int8_speedup(bert: Bert, choice, packed, plan: str) -> tuple[float | None, str]:
    """The int8 plan's speed against fp32 (the chosen fp32 GEMMs), whole model, on the calibration
    batch; cached with the kernel choice under ``plan`` (what makes the plan), unless other
    processes took much of the CPUs meanwhile (then the second item says so, and it holds for
    this run only). None where nothing is measured (``BERTSCOPE_TUNE=0``) or a side failed."""
    from .fast.tuning import cpu_ticks, measured_speedup, measuring, others_share, save_choice

    if choice is None or choice.source == "default":
        return None, ""
    if plan in choice.int8_speedup:
        return choice.int8_speedup[plan], ""
    fp32 = PackedEncoder(gemm=GemmBackend(), tune=False)
    fp32.apply(choice)  # the fp32 GEMM library and attention slack measured here

    def run(encoder: PackedEncoder):
        with torch.inference_mode():
            return encoder.encode(bert.encoder, packed)

    with measuring() as watch:
        before = cpu_ticks()
        speedup = measured_speedup(lambda: run(bert.fast), lambda: run(fp32))
        share = others_share(before, cpu_ticks())
    # this measurement's own reading, or the choice's where it was measured (not cached) just now
    verdict = "the speed verdict"
    busy = busy_note(share, verdict) or threads_note(watch.others, verdict) or (
        busy_note(choice.busy, verdict) or threads_note(choice.busy_threads, verdict)
        if choice.source == "measured" else "")
    if speedup is not None:
        speedup = round(speedup, 4)  # as cached: a note read later from the cache says the same
    if speedup is not None and not busy:
        choice.int8_speedup[plan] = speedup
        save_choice(choice)
    return speedup, busy


def _check_bf16(bert: Bert, keep_precision: bool = False) -> None:
    """bf16 mode stays on only where the CPU runs bf16 natively, faster (or ``keep_precision``),
    and within BF16_BOUND."""
    why = ""
    if not {"avx512_bf16", "amx_bf16"} & set(cpu_flags()):
        why = "this CPU has neither AVX512-BF16 nor AMX"
    elif not bert.fast.gemm.onednn_usable():
        why = "this torch has no oneDNN linear"
    else:
        with torch.inference_mode():
            choice = bert.fast.prepare(bert.encoder)
        speedup = choice.bf16_speedup if choice is not None else None
        raced = (choice.timings.get("bf16") or {}).get("bf16") if choice is not None else None
        got = None
        if isinstance(raced, str):  # the race recorded the bf16 candidate's error
            why = f"the bf16 GEMM does not run here ({raced})"
        elif speedup is not None and speedup < 1 + NOISE_MARGIN and not keep_precision:
            busy = (busy_note(choice.busy, "the speed verdict") or threads_note(choice.busy_threads, "the speed verdict")
                    if choice.source == "measured" else "")  # timed others' work too
            why = (f"bf16 GEMMs measured {speedup:.2f}x the speed of fp32 here{'; ' + busy if busy else ''} "
                   f"({_KEEP} keeps bf16)")
        else:
            packed = _calibration_batch(bert)
            try:
                with torch.inference_mode():
                    bert.fast.gemm.precision = "fp32"
                    ref = sentence_means(bert.fast.encode(bert.encoder, packed), packed)  # (B, C)
                    bert.fast.gemm.precision = "bf16"
                    got = sentence_means(bert.fast.encode(bert.encoder, packed), packed)  # (B, C)
            except ONEDNN_REFUSALS as e:  # a CPU flag says bf16, but oneDNN refuses it
                why = f"the bf16 GEMM does not run here ({type(e).__name__}: {str(e).splitlines()[0]})"
        if got is not None:
            cos = (got * ref).sum(1)  # (B,)
            mean, low = float(cos.mean()), float(cos.min())
            if mean < BF16_BOUND[0] or low < BF16_BOUND[1]:
                why = f"bf16 embeddings' cosine to fp32 was {mean:.4f} mean, {low:.4f} min, below {BF16_BOUND}"
            else:
                bert.precision = "bf16"
                bert.precision_note = (f"bf16 GEMMs ({'' if speedup is None else f'{speedup:.2f}x fp32, '}"
                                       f"calibration cosine to fp32 {mean:.4f} mean, {low:.4f} min)")
                return
    bert.fast.gemm.precision = "fp32"
    bert.precision_note = f"bf16 is off: {why}; running fp32"
    warn_caller(f"bertscope: {bert.precision_note}", RuntimeWarning)
