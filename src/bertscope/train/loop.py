"""The fine-tuning loop: plain PyTorch on the packed path, resumable exactly.

Shape legend: B examples in a batch, N their real tokens (packed), C hidden size, K labels.

Per step:
    packed  = pack_ids(batch)                                 (N,) real tokens, no padding
    logits  = head(encoder_packed(packed)[first token of each])   (B, K)   dropout on, as configured
    loss    = mean cross-entropy; backward; clip the gradient norm at 1.0
    AdamW step (decoupled weight decay; none on biases and LayerNorm: Loshchilov & Hutter 2019)
    learning rate: linear warm-up over the first ``warmup`` share of steps, then linear decay to 0

Dropout is active wherever the checkpoint's config puts it: embeddings, after attention and
the feed-forward (hidden_dropout_prob), on the attention probabilities (attention_probs_dropout_prob,
inside SDPA per length group), and before the head. The packed path computes nothing on padding
(tests hold its loss and gradients equal to the padded reference path's).

Checkpoints (``DIR/training_state.pt``) are written atomically every ``save_every`` steps and
at each epoch end: model, optimizer, scheduler, the RNG state, the data position (epoch, batch)
and the metrics so far. Batches depend only on (seed, epoch), so ``resume=True`` rebuilds the
plan and continues at the same batch with the same random numbers: in fp32 on the CPU a resumed
run ends with exactly the weights of an uninterrupted one. When training ends, the HF-format
folder and metrics.json are written and the state file is removed.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..bert import Bert, load
from ..core.checkpoint import FINETUNE_STATE_FILE, bundled_model_path, read_config
from ..core.classifier import BertForSequenceClassification
from ..core.model import evaluating
from ..core.tokenizer import least_read_length, tokenless
from ..errors import CheckpointError, InputError, InputTypeError, NonFiniteError, bad_whole, check_seed, os_reason, setting
from ..fast.encoder import PackedEncoder
from ..fast.packing import pack_ids
from ..files import TEMP_SUFFIX, FolderLock, lock_holder, nearly_full, sha256_file, write_atomic, write_text_atomic
from .batches import epoch_batches
from .data import Example, LabelSet, read_examples
from .metrics import accuracy, macro_f1
from .output import save_classifier

__all__ = ["FinetuneConfig", "FinetuneResult", "KILL_HOOK_ENV", "METRICS_FILE", "STATE_FILE", "StepInfo",
           "finetune", "linear_schedule", "make_optimizer", "train_step", "training_loss"]

log = logging.getLogger(__name__)

STATE_FILE = FINETUNE_STATE_FILE
LOCK_FILE = ".lock"  # held by the run that trains in the folder (files.FolderLock)
METRICS_FILE = "metrics.json"
STATE_FORMAT = 1
# Test hook: SIGKILL this process right after the checkpoint of this global step is written.
KILL_HOOK_ENV = "BERTSCOPE_TRAIN_KILL_AFTER_STEP"
MAX_EPOCHS = 10_000  # every epoch's batches are planned before the first step (the schedule needs their count)
# Settings a resumed run must share with the interrupted one (the rest, e.g. save_every, may change).
_RESUME_KEYS = ("train", "dev", "model", "text_field", "pair_field", "label_field", "max_length", "epochs",
                "lr", "batch_tokens", "batch_size", "warmup", "weight_decay", "seed", "packed")


@dataclass(frozen=True)
class FinetuneConfig:
    """Everything that shapes a fine-tuning run (the ``bertscope finetune`` flags)."""

    train: str
    dev: str | None = None
    model: str | None = None  # a checkpoint folder; None = the bundled all-MiniLM-L6-v2
    text_field: str = "text"
    pair_field: str | None = None
    label_field: str = "label"
    max_length: int = 192
    epochs: int = 3
    lr: float = 5e-5
    batch_tokens: int | None = None  # real tokens per batch; None = 16 x max_length
    batch_size: int | None = 32  # at most this many examples per batch; None = no cap
    warmup: float = 0.1  # share of the steps with a rising learning rate
    weight_decay: float = 0.01
    seed: int = 0
    save_every: int = 200  # steps between checkpoints (0 = only at epoch ends)
    packed: bool = True  # False: the padded reference path (for comparison)

    def __post_init__(self) -> None:
        for name in ("train", "dev", "model"):  # a Path is a path: kept as its text (JSON, resume)
            v = getattr(self, name)
            if isinstance(v, os.PathLike):
                object.__setattr__(self, name, os.fspath(v))
            elif v is None and name != "train":
                continue
            elif v is None:
                raise InputTypeError("train is required: a .csv, .tsv or .jsonl (.ndjson, .json) file of labelled examples")
            elif not isinstance(v, str):
                what = "a checkpoint folder" if name == "model" else ".csv, .tsv or .jsonl (.ndjson, .json) records"
                raise InputTypeError(f"{name} must be a file path (a str or Path) of {what}, not "
                                     f"{type(v).__name__}" + (": write the examples to a .jsonl file first"
                                                              if name != "model" else ""))

    @property
    def tokens_per_batch(self) -> int:
        return _tokens_per_batch(self.batch_tokens, self.max_length)

    def check(self) -> None:
        """Raise InputError (one line) for a value out of range."""
        def whole(name: str, low: int) -> None:
            v = getattr(self, name)
            n = v if isinstance(v, int) and not isinstance(v, bool) else None
            if n is None or n < low:
                raise bad_whole(n, f"{_named(name)} must be a whole number >= {low}, got {v!r}")

        whole("epochs", 1)
        if self.epochs > MAX_EPOCHS:  # every epoch's batches are planned up front, for the schedule
            raise InputError(f"{_named('epochs')} must be at most {MAX_EPOCHS:,} (fine-tuning takes a few), "
                             f"got {self.epochs:,}")
        # room for one token of each text besides [CLS] A [SEP] (B [SEP]): under that, nothing is learnt
        whole("max_length", least_read_length(bool(self.pair_field)))
        whole("save_every", 0)
        check_seed(self.seed)
        if self.batch_tokens is not None:
            whole("batch_tokens", 1)
        if self.batch_size is not None:
            whole("batch_size", 1)
        def number(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                kind = InputError if isinstance(v, float) else InputTypeError  # NaN, inf: wrong values
                raise kind(f"{_named(name)} must be a number, got {v!r}")
            return v

        if not number("lr") > 0:
            raise InputError(f"{_named('lr')} must be a positive number, got {self.lr!r}")
        if not 0.0 <= number("warmup") < 1.0:
            raise InputError(f"{_named('warmup')} must be a share of the steps in [0, 1), got {self.warmup!r}")
        if not number("weight_decay") >= 0:
            raise InputError(f"{_named('weight_decay')} must be >= 0, got {self.weight_decay!r}")
        if self.text_field == self.label_field or self.pair_field in (self.text_field, self.label_field):
            raise InputError(f"{_named('text_field')}, {_named('pair_field')} and {_named('label_field')} "
                             "must name different fields")


_FLAGS = {"pair_field": "--text-pair-field", "train": "TRAIN"}  # flags other than --NAME-WITH-DASHES


def _tokens_per_batch(batch_tokens: int | None, max_length: int) -> int:
    """The real tokens per batch: ``batch_tokens``, or by default 16 examples at ``max_length``."""
    return batch_tokens if batch_tokens is not None else 16 * max_length


def _as_run(key: str, config: dict) -> object:
    """A setting of a run (``config``: its FinetuneConfig as a dict) as the run used it: a
    batch_tokens left at its default is the number it stood for."""
    if key == "batch_tokens":
        return _tokens_per_batch(config.get("batch_tokens"), config["max_length"])
    return config.get(key)


def _changed(key: str, now: dict, then: dict) -> str:
    """How a resumed run's setting differs from the interrupted run's (``now``, ``then``: their
    configs as dicts), in words: a setting left out is "not given" (the model: "the bundled
    model"; the batch budget: the default it stood for), never Python's None."""
    def shown(config: dict) -> str:
        value = config.get(key)
        if value is not None:
            return repr(value)
        if key == "batch_tokens":
            return f"the default (16 x {_named('max_length')} = {_as_run(key, config)})"
        return "the bundled model" if key == "model" else ""

    now_s = f"is {shown(now)}" if shown(now) else "is not given"
    then_s = f"used {shown(then)}" if shown(then) else "had none"
    return f"{_named('resume')}: {_named(key)} {now_s}, but the interrupted run {then_s}"


def _named(name: str) -> str:
    """A setting as both callers know it: ``lr (--lr)``, ``pair_field (--text-pair-field)``,
    ``train (TRAIN)``."""
    return setting(name, _FLAGS.get(name, "--" + name.replace("_", "-")))


@dataclass(frozen=True)
class StepInfo:
    """What the progress callback hears after each step."""

    epoch: int  # 0-based
    step: int  # global steps done, 1-based
    total_steps: int
    loss: float
    tokens_per_s: float  # real tokens per second of this epoch's training steps so far (see _speed)


@dataclass
class FinetuneResult:
    """What :func:`finetune` wrote and measured. ``model`` is the trained torch module (a
    :class:`BertForSequenceClassification`, eval mode); ``bertscope.load(result.out_dir)`` gives
    the classifier with its tokenizer (``.classify(texts)``, ``explain``, ``trace``...).
    ``metrics`` is metrics.json: ``metrics["epochs"]`` one row per epoch (train_loss,
    tokens_per_s, dev_accuracy, dev_majority_accuracy, dev_macro_f1...)."""

    out_dir: Path
    metrics: dict
    model: BertForSequenceClassification
    labels: list[str]
    resumed_from_step: int = 0
    truncated: int = 0
    written: list[Path] = field(default_factory=list)


def _speed(acc: dict) -> float:
    """Real tokens per second of an epoch's training steps, leaving out the first step this
    process ran (its one-time set-up: first allocations, kernel plans) once any other step was
    timed. On the 2-CPU Zen 4 host that step took 0.56-0.62 s against 0.5 s for the median later
    step (the bundled model, 32 texts of up to 64 tokens): a small share of a long epoch, a large
    one of a short epoch's few steps on a slower first call. An epoch that a resumed run finishes
    had two processes, each with a first step: ``warmup_seconds`` and ``warmup_tokens`` add up
    both, and both are left out."""
    tokens, seconds = acc["tokens"], acc["train_seconds"]
    if tokens > acc.get("warmup_tokens", 0):
        tokens -= acc.get("warmup_tokens", 0)
        seconds -= acc.get("warmup_seconds", 0.0)
    return tokens / max(seconds, 1e-9)


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """torch's AdamW (betas 0.9, 0.999; eps 1e-8), with no weight decay on biases and LayerNorm
    parameters (the grouping HF's Trainer uses)."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if name.endswith("bias") or id(p) in norm_params else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)


def linear_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """lr(t) = lr · t / warmup for t < warmup, then lr · (total - t) / (total - warmup), down to 0."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def training_loss(model: BertForSequenceClassification, encoder: PackedEncoder, ids: list[list[int]],
                  types: list[list[int]], labels: list[int], *, packed: bool = True,
                  pad_id: int = 0) -> tuple[torch.Tensor, int]:
    """The mean cross-entropy of one batch, and its real tokens.

    ``packed``: the padding-free path (:meth:`PackedEncoder.classify`); else the padded
    reference path (``model(input_ids, attention_mask, token_type_ids)``).
    """
    device = next(model.parameters()).device
    tokens = sum(len(t) for t in ids)
    if packed:
        p = pack_ids(ids, types, device=device)
        logits = encoder.classify(model, p)  # (B, K) in packed order
        gold = torch.tensor([labels[j] for j in p.order], device=device)  # (B,)
    else:
        B, T = len(ids), max(len(t) for t in ids)
        input_ids = torch.full((B, T), pad_id, dtype=torch.long)  # (B, T)
        mask = torch.zeros(B, T, dtype=torch.long)  # (B, T)
        segs = torch.zeros(B, T, dtype=torch.long)  # (B, T)
        for b, (t, s) in enumerate(zip(ids, types)):
            input_ids[b, :len(t)] = torch.tensor(t)
            mask[b, :len(t)] = 1
            segs[b, :len(s)] = torch.tensor(s)
        logits = model(input_ids.to(device), mask.to(device), segs.to(device)).logits  # (B, K)
        gold = torch.tensor(labels, device=device)  # (B,)
    return model.loss_fn(logits, gold), tokens


def train_step(model: BertForSequenceClassification, encoder: PackedEncoder, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, ids: list[list[int]], types: list[list[int]],
               labels: list[int], *, packed: bool = True, pad_id: int = 0, max_grad_norm: float = 1.0,
               ) -> tuple[float, int]:
    """One optimizer step on one batch: loss, backward, clip the gradient norm, AdamW, schedule.
    Returns the batch's loss (before the step) and its real tokens."""
    loss, tokens = training_loss(model, encoder, ids, types, labels, packed=packed, pad_id=pad_id)
    if not torch.isfinite(loss.detach()):  # before the step: the weights stay as they were
        raise NonFiniteError(f"the training loss became {float(loss.detach())}: the run diverged (a learning "
                             "rate too high for this model?)")
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if not torch.isfinite(norm):  # a finite loss with an infinite gradient: no step either
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"the gradient's norm became {float(norm)}: the run diverged (a learning rate "
                             "too high for this model?)")
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach()), tokens


def _fingerprint(path: str | None) -> str | None:
    if path is None:
        return None
    return sha256_file(path).hexdigest()


def _same_path(a: object, b: object, model: bool) -> bool:
    """Whether two paths of a run's settings name the same file or folder (``./x`` and ``x``, or
    from another working folder); for the model, None is the bundled folder."""
    if model:
        a, b = (str(bundled_model_path()) if v is None else v for v in (a, b))
    if a is None or b is None or not isinstance(a, str) or not isinstance(b, str):
        return a == b
    try:
        return os.path.samefile(Path(a).expanduser(), Path(b).expanduser())
    except OSError:
        return a == b


def _holds_nothing(out: Path) -> bool:
    """Whether ``out`` is absent, or holds nothing but a stopped write's temporary files and the
    lock file: what a run stopped before its first checkpoint leaves."""
    return not out.is_dir() or all((p.name.startswith(".") and p.name.endswith(TEMP_SUFFIX)) or p.name == LOCK_FILE
                                   for p in out.iterdir())


def _check_out(out: Path, resume: bool) -> bool:
    """Refuse an ``out`` this run cannot use; return whether it resumes. ``resume`` on a folder
    that holds nothing yet (a run stopped before its first checkpoint; none began) starts a new
    run there, as ``bertscope embed --resume`` does: a script may always pass it."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{_named('out')} must be a folder: {out} is a file")
    state = out / STATE_FILE
    if resume:
        if state.is_file():
            return True
        if (out / METRICS_FILE).is_file():
            raise InputError(f"{_named('resume')}: the run in {out} is already complete (it has {METRICS_FILE} "
                             f"and no {STATE_FILE})")
        if not _holds_nothing(out):
            raise InputError(f"{_named('resume')}: {out} holds no interrupted run (no {STATE_FILE})")
        pid = lock_holder(out / LOCK_FILE)
        if pid is not None:  # a run still before its first checkpoint: said as in use, not "starting"
            raise _in_use(out)(pid)
        log.warning("%s: %s holds no checkpoint yet (a run stopped before its first one, or none began); "
                    "starting a new run there", _named("resume"), out)
    elif not _holds_nothing(out):
        if state.is_file():
            pid = lock_holder(out / LOCK_FILE)
            if pid is not None:  # still training: "pass --resume" would only meet the lock
                raise _in_use(out)(pid)
            raise InputError(f"{_named('out')}: {out} holds an interrupted run; pass {_named('resume')} to "
                             "continue it, or choose a new folder")
        if (out / METRICS_FILE).is_file():  # --resume would only be refused: the run is complete
            raise InputError(f"{_named('out')}: {out} holds a finished run ({METRICS_FILE}); choose a new "
                             "folder (or delete this one to train it again)")
        raise InputError(f"{_named('out')}: {out} exists and is not empty (and holds no run to resume); "
                         "choose a new folder")
    existing = out
    while not existing.exists():  # the nearest folder that exists must take a new folder, now
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{_named('out')}: {out} cannot be a folder: {existing} is a file")
    try:  # a real write: permission bits do not tell for root, /proc or a read-only mount
        probe = tempfile.mkdtemp(prefix=".bertscope-check-", suffix=TEMP_SUFFIX, dir=existing)
    except OSError as e:
        raise InputError(f"{_named('out')}: {out} cannot be created in {existing} ({os_reason(e)})") from None
    os.rmdir(probe)
    return False


def _predict_a_few(model: BertForSequenceClassification, encoder: PackedEncoder, ids: list, types: list) -> None:
    """The logits of the first few examples, through the training's own encoder (no kernel
    choice measured for it), in eval mode; NonFiniteError if any is NaN or infinite."""
    with evaluating(model), torch.no_grad():
        logits = encoder.classify(model, pack_ids(ids[:16], types[:16], device=next(model.parameters()).device))
    if not bool(torch.isfinite(logits).all()):
        raise NonFiniteError("non-finite logits")


def _finite(predict: Callable[[], object], when: str, lr: float):
    """``predict()``, or NonFiniteError saying the run diverged and what to do."""
    try:
        return predict()
    except NonFiniteError:
        raise NonFiniteError(f"{when} the model computes NaN or infinity: training diverged and no model "
                             f"was written; start again in a new {_named('out')} folder with a lower "
                             f"{_named('lr')[:-1]}; this run's: {lr:g})") from None


@dataclass
class _Data:
    train: list[Example]
    dev: list[Example]
    labels: LabelSet
    train_y: list[int]
    dev_y: list[int]


def _read_data(cfg: FinetuneConfig) -> _Data:
    kw = dict(text_field=cfg.text_field, pair_field=cfg.pair_field, label_field=cfg.label_field)
    train = read_examples(cfg.train, what="TRAIN", **kw)
    labels = LabelSet.from_examples(train, cfg.train)
    dev = read_examples(cfg.dev, what="DEV", **kw) if cfg.dev is not None else []
    return _Data(train, dev, labels, labels.ids(train, cfg.train), labels.ids(dev, f"DEV {cfg.dev}"))


def _model_folder(cfg: FinetuneConfig) -> Path:
    return bundled_model_path() if cfg.model is None else Path(cfg.model).expanduser()


def _save_state(path: Path, state: dict) -> None:
    def write(f) -> None:
        try:
            torch.save(state, f)
        except RuntimeError as e:  # torch's zip writer says "unexpected pos ..." for a full disk
            if nearly_full(path):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from e  # write_atomic names the file
            raise

    write_atomic(path, write, fsync=True)


def _load_state(path: Path) -> dict:
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # a corrupt file surfaces in many exception types
        raise InputError(f"{_named('resume')}: {path} could not be read ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise InputError(f"{_named('resume')}: {path} is not a bertscope training state")
    return state


def _tokenize(bert: Bert, examples: list[Example], max_length: int, what: str,
              path: object) -> tuple[list[list[int]], list[list[int]], int]:
    """Ids, segment ids and the number of texts cut. A text (or pair) of only characters the
    tokenizer drops (U+200B...) is refused, with its line, as an empty one is when it is read."""
    pairs = [e.pair or "" for e in examples] if any(e.pair is not None for e in examples) else None
    ids, types, cut = bert.tokenizer.encode_segments([e.text for e in examples], pairs, max_length=max_length)
    bad = [e.line for e, row, c in zip(examples, ids, cut) if tokenless(row, pair=pairs is not None) and not c]
    if bad:
        shown = "; ".join(f"line {n} has no tokens (only characters the tokenizer drops)" for n in bad[:3])
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        raise InputError(f"{what} {path}: {len(bad)} bad record(s): {shown}{more}")
    return ids, types, sum(cut)


def finetune(cfg: FinetuneConfig, out: str | Path, *, resume: bool = False,
             on_step: Callable[[StepInfo], None] | None = None,
             on_epoch: Callable[[dict], None] | None = None,
             on_start: Callable[[int, int], None] | None = None) -> FinetuneResult:
    """Fine-tune ``cfg.model`` on ``cfg.train`` and write the classifier folder ``out``.

    Everything is checked before any work or any file is written: the settings, ``out`` (not
    a file; empty or absent unless ``resume``, which starts a new run, with a warning, where it
    holds no checkpoint yet; no other run in it now), the model's positions
    against ``max_length``, and the data (records, labels, the dev labels against the train's).
    ``on_start(total, done)`` is called once training begins, ``on_step`` after every step,
    ``on_epoch`` with each epoch's metrics. Returns the metrics and the trained model (eval mode).

    A run holds ``out/.lock`` while it trains: a second run in the same folder (a ``resume``
    started while the first still runs) is refused, naming the first one's pid.
    """
    held: list[FolderLock] = []
    try:
        return _finetune(cfg, out, resume, on_step, on_epoch, on_start, held)
    finally:
        for lock in held:
            lock.close(remove=True)  # the folder keeps only the run's outputs


def _in_use(out: Path) -> Callable[[str], InputError]:
    return lambda pid: InputError(f"{_named('out')}: {out} is in use by another fine-tuning run (pid {pid}); wait "
                                  "for it to finish, or choose another folder")


def _finetune(cfg: FinetuneConfig, out: str | Path, resume: bool, on_step, on_epoch, on_start,
              held: list[FolderLock]) -> FinetuneResult:
    if not isinstance(cfg, FinetuneConfig):
        raise InputTypeError(f"finetune takes a FinetuneConfig(train=...), not {type(cfg).__name__}")
    cfg.check()
    out = Path(out)
    resume = _check_out(out, resume)
    pid = lock_holder(out / LOCK_FILE)
    if pid is not None:  # said now, before the model and the data are read
        raise _in_use(out)(pid)
    folder = _model_folder(cfg)
    try:
        positions = read_config(folder).max_position_embeddings
    except CheckpointError:
        raise
    if cfg.max_length > positions:
        raise InputError(f"{_named('max_length')} must be at most the model's {positions} positions, "
                         f"got {cfg.max_length}")
    data = _read_data(cfg)
    fingerprint = {"train": _fingerprint(cfg.train), "dev": _fingerprint(cfg.dev)}
    paths = {k: None if v is None else str(Path(v).expanduser().resolve())  # resume from any folder
             for k, v in (("train", cfg.train), ("dev", cfg.dev), ("model", cfg.model))}
    state = None
    if resume:
        state = _load_state(out / STATE_FILE)
        before = state["config"]
        for key in _RESUME_KEYS:
            if key in ("train", "dev", "model"):  # as absolute paths, where the state has them
                if _same_path(state.get("paths", {}).get(key, before.get(key)), getattr(cfg, key), key == "model"):
                    continue
            if _as_run(key, before) != _as_run(key, asdict(cfg)):
                raise InputError(_changed(key, asdict(cfg), before))
        changed = [key for key in ("train", "dev") if state["fingerprint"].get(key) != fingerprint[key]]
        if changed:
            which = " and ".join(f"{_named(key)} {getattr(cfg, key)}" for key in changed)
            raise InputError(f"{_named('resume')}: the file {which} changed since the interrupted run "
                             "(its contents differ); resume with the same data, or start a new run")

    base = load(folder)
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(cfg.seed)
        model = BertForSequenceClassification(base.config, len(data.labels.names),
                                              id2label=data.labels.id2label, encoder=base.encoder)
        bert = Bert(config=base.config, model=model, tokenizer=base.tokenizer, path=folder,
                    max_seq_length=cfg.max_length, name=base.name)
        train_ids, train_types, cut = _tokenize(bert, data.train, cfg.max_length, "TRAIN", cfg.train)
        dev_ids, dev_types, _ = _tokenize(bert, data.dev, cfg.max_length, "DEV", cfg.dev)
        lengths = [len(t) for t in train_ids]
        over = sum(n > cfg.tokens_per_batch for n in lengths)
        if over:  # token_budget_batches gives each a batch of its own: said, not silently over budget
            log.warning("%d of the %d training examples are longer than the %d-token budget (%s): each is "
                        "a batch of its own, over the budget", over, len(lengths), cfg.tokens_per_batch,
                        _named("batch_tokens"))
        plans = [epoch_batches(lengths, cfg.tokens_per_batch, cfg.batch_size, cfg.seed, e)
                 for e in range(cfg.epochs)]
        total = sum(len(p) for p in plans)
        optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
        # at most total - 1 warm-up steps: the first step's rate is 0, so with a single step in all
        # (a few examples, one epoch) warm-up would leave the model exactly as it was
        scheduler = linear_schedule(optimizer, min(math.ceil(cfg.warmup * total), total - 1), total)

        epoch, batch, step = 0, 0, 0
        history: list[dict] = []
        acc = {"loss_sum": 0.0, "examples": 0, "tokens": 0, "train_seconds": 0.0, "wall_seconds": 0.0}
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"])
            epoch, batch, step = state["epoch"], state["batch"], state["global_step"]
            history, acc = state["history"], state["epoch_progress"]
        resumed_from = step
        kill_at = int(os.environ.get(KILL_HOOK_ENV, "0") or 0)

        def checkpoint(e: int, b: int) -> None:
            _save_state(out / STATE_FILE, {
                "format": STATE_FORMAT, "config": asdict(cfg), "fingerprint": fingerprint, "paths": paths,
                "labels": list(data.labels.names), "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": torch.get_rng_state(), "epoch": e, "batch": b, "global_step": step,
                "history": history, "epoch_progress": dict(acc)})
            if kill_at and step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"{_named('out')}: {out} cannot be created ({e.strerror})") from None
        held.append(FolderLock(out / LOCK_FILE, _in_use(out)))  # two runs that started at once: one goes on
        _check_out(out, resume)  # again, now that no other run can change the folder: one may have finished
        if on_start is not None:
            on_start(total, step)
        encoder = PackedEncoder()
        mark = time.perf_counter()

        def tick() -> None:  # wall time since the last tick goes to this epoch
            nonlocal mark
            now = time.perf_counter()
            acc["wall_seconds"] += now - mark
            mark = now

        try:
            while epoch < cfg.epochs:
                plan = plans[epoch]
                model.train()
                while batch < len(plan):
                    idx = plan[batch]
                    t0 = time.perf_counter()
                    try:
                        loss, tokens = train_step(model, encoder, optimizer, scheduler, [train_ids[i] for i in idx],
                                                  [train_types[i] for i in idx], [data.train_y[i] for i in idx],
                                                  packed=cfg.packed, pad_id=bert.tokenizer.pad_id)
                    except NonFiniteError as e:
                        raise NonFiniteError(f"at step {step + 1} of {total} (epoch {epoch + 1}), {e}: no model "
                                             f"was written; start again in a new {_named('out')} folder with a "
                                             f"lower {_named('lr')[:-1]}; this run's: {cfg.lr:g})") from None
                    took = time.perf_counter() - t0
                    acc["train_seconds"] += took
                    if step == resumed_from:  # this process's first step: its warm-up, kept apart
                        acc["warmup_seconds"] = acc.get("warmup_seconds", 0.0) + took
                        acc["warmup_tokens"] = acc.get("warmup_tokens", 0) + tokens
                    acc["loss_sum"] += loss * len(idx)
                    acc["examples"] += len(idx)
                    acc["tokens"] += tokens
                    batch += 1
                    step += 1
                    if on_step is not None:
                        on_step(StepInfo(epoch, step, total, loss, _speed(acc)))
                    if cfg.save_every and step % cfg.save_every == 0 and batch < len(plan):
                        tick()
                        checkpoint(epoch, batch)
                row = {"epoch": epoch + 1, "steps": len(plan), "train_loss": acc["loss_sum"] / max(1, acc["examples"]),
                       "train_tokens": acc["tokens"], "train_seconds": acc["train_seconds"],
                       "tokens_per_s": _speed(acc)}
                if "warmup_seconds" in acc:
                    row.update(warmup_seconds=acc["warmup_seconds"], warmup_tokens=acc["warmup_tokens"])
                if data.dev:
                    t0 = time.perf_counter()
                    probs = _finite(lambda: bert.classify_ids(dev_ids, dev_types, batch_tokens=cfg.tokens_per_batch),
                                    f"after epoch {epoch + 1} (step {step} of {total})", cfg.lr)
                    pred = probs.argmax(1).tolist()
                    majority = max(range(len(data.labels.names)), key=data.train_y.count)  # TRAIN's commonest
                    row.update(dev_accuracy=accuracy(pred, data.dev_y),
                               dev_macro_f1=macro_f1(pred, data.dev_y, len(data.labels.names)),
                               # the baseline that learns nothing: TRAIN's commonest label for every text
                               dev_majority_accuracy=accuracy([majority] * len(pred), data.dev_y),
                               dev_labels_predicted=len(set(pred)),
                               dev_seconds=time.perf_counter() - t0)
                else:  # an epoch's last update is checked by no loss: a few predictions check it, before it is saved
                    _finite(lambda: _predict_a_few(model, encoder, train_ids, train_types),
                            f"after epoch {epoch + 1} (step {step} of {total})", cfg.lr)
                tick()
                row["wall_seconds"] = acc["wall_seconds"]
                history.append(row)
                if on_epoch is not None:
                    on_epoch(row)
                epoch, batch = epoch + 1, 0
                acc = {"loss_sum": 0.0, "examples": 0, "tokens": 0, "train_seconds": 0.0, "wall_seconds": 0.0}
                checkpoint(epoch, batch)
                mark = time.perf_counter()
        except NonFiniteError:  # the message says: start again in a new --out; no diverged state is kept
            (out / STATE_FILE).unlink(missing_ok=True)
            raise

    model.eval()
    written = save_classifier(out, model, folder, cfg.max_length)
    metrics = {
        "model": str(folder), "train": cfg.train, "dev": cfg.dev, "labels": list(data.labels.names),
        "train_examples": len(data.train), "dev_examples": len(data.dev), "train_truncated": cut,
        "settings": {k: v for k, v in asdict(cfg).items() if k not in ("train", "dev", "model")}
        | {"batch_tokens": cfg.tokens_per_batch},
        "total_steps": total, "epochs": history,
        "train_seconds": sum(r["train_seconds"] for r in history),
        "wall_seconds": sum(r["wall_seconds"] for r in history),
    }
    written.append(write_text_atomic(out / METRICS_FILE, json.dumps(metrics, indent=1, allow_nan=False)))
    (out / STATE_FILE).unlink(missing_ok=True)
    return FinetuneResult(out_dir=out, metrics=metrics, model=model, labels=list(data.labels.names),
                          resumed_from_step=resumed_from, truncated=cut, written=written)
