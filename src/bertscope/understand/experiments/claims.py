"""The seed's claims as experiments on a real checkpoint, one function each.

Shape legend: N layers, H heads, T tokens, D head size, C = H·D hidden size.

    s1_self_match     S1: with Q = K = x, how often is a token's best match itself? And with W_Q, W_K?
    s3_scaling        S3: softmax with and without ÷√D: entropy and largest weight per layer
    s4_padding        S4: outputs alone, padded with the mask, and padded with PAD attended
    s11_permutation   S11: permutation equivariance without position embeddings, broken with them
    s12_referent      S12: heads that point it -> animal, and whether they follow the referent
    errata            the seed's softmax example, and the 7x claim as FLOPs

Each returns a typed record; :func:`render_markdown` turns them into docs/EXPERIMENTS.md.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ...core.config import BertConfig
from ..inspect import attend
from ...bert import Bert, analysis

__all__ = ["Errata", "S1Result", "S3Result", "S4Result", "S11Result", "S12Result", "builtin_sentences",
           "errata", "flops_per_forward", "s1_self_match", "s3_scaling", "s4_padding", "s11_permutation",
           "s12_referent"]

TIRED = "The animal didn't cross the street because it was too tired"
WIDE = "The animal didn't cross the street because it was too wide"


def builtin_sentences() -> list[str]:
    """bertscope's own small corpus (24 sentences written for it), one per line."""
    p = Path(__file__).parents[1] / "data" / "sentences.txt"
    return [s.strip() for s in p.read_text(encoding="utf-8").splitlines() if s.strip()]


def _run(bert: Bert, text: str, **kw):
    batch = bert.encode([text])
    dev = bert.device
    return batch, bert.encoder(batch.input_ids.to(dev), batch.attention_mask.to(dev),
                             batch.token_type_ids.to(dev), **kw)


# --------------------------------------------------------------------------------------- S1
@dataclass(frozen=True)
class S1Result:
    """Per layer (N,): share of query tokens whose highest score is their own key.

    identity: scores x·xᵀ (Q = K = x, no projection); identity_cosine: the same with unit-length x
    (always 1 by Cauchy-Schwarz, shown as the check); learned: q·kᵀ with the layer's W_Q and W_K,
    averaged over heads. ``tokens`` query tokens in all.
    """

    identity: list[float]
    identity_cosine: list[float]
    learned: list[float]
    tokens: int


@analysis
def s1_self_match(bert: Bert, texts: list[str]) -> S1Result:
    N = bert.config.num_hidden_layers
    ident = torch.zeros(N)
    cos = torch.zeros(N)
    learned = torch.zeros(N)
    total = 0
    for text in texts:
        _, out = _run(bert, text, output_hidden_states=True, output_attentions=True)
        for li in range(N):
            x = out.hidden_states[li][0].float()  # (T, C): the layer's input
            T = x.shape[0]
            self_idx = torch.arange(T, device=x.device)
            ident[li] += float((x @ x.T).argmax(-1).eq(self_idx).sum())  # (T, C)@(C, T) -> (T, T)
            xn = F.normalize(x, dim=-1)
            cos[li] += float((xn @ xn.T).argmax(-1).eq(self_idx).sum())
            sc = out.scores[li][0].float()  # (H, T, T) the model's own q·kᵀ/√D
            learned[li] += float(sc.argmax(-1).eq(self_idx).float().mean(0).sum())
        total += out.hidden_states[0].shape[1]
    return S1Result(identity=(ident / total).tolist(), identity_cosine=(cos / total).tolist(),
                    learned=(learned / total).tolist(), tokens=total)


# --------------------------------------------------------------------------------------- S3
@dataclass(frozen=True)
class S3Result:
    """Per layer (N,): mean row entropy (nats) and mean largest weight, with ÷√D (as trained) and
    without it (the same scores × √D). ``ln_t``: mean ln T (uniform attention's entropy).
    ``random``: for random q, k ~ N(0, 1) of width D: (D, std of q·k, std of q·k/√D)."""

    entropy_scaled: list[float]
    entropy_unscaled: list[float]
    max_scaled: list[float]
    max_unscaled: list[float]
    ln_t: float
    random: list[tuple[int, float, float]]
    head_size: int


@analysis
def s3_scaling(bert: Bert, texts: list[str], seed: int = 0) -> S3Result:
    N = bert.config.num_hidden_layers
    D = bert.config.head_size
    acc = {k: torch.zeros(N, dtype=torch.float64) for k in ("es", "eu", "ms", "mu")}
    rows = 0
    ln_t = 0.0
    for text in texts:
        _, out = _run(bert, text, output_attentions=True)
        T = out.scores[0].shape[-1]
        for li in range(N):
            s = out.scores[li][0].double()  # (H, T, T) scaled, as the model computes them
            for key, scale in (("s", 1.0), ("u", math.sqrt(D))):
                p = torch.softmax(s * scale, -1)  # (H, T, T)
                ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # (H, T)
                acc["e" + key][li] += float(ent.sum())
                acc["m" + key][li] += float(p.max(-1).values.sum())
        H = out.scores[0].shape[1]
        rows += H * T
        ln_t += math.log(T) * T
    g = torch.Generator().manual_seed(seed)
    rnd = []
    for d in (16, 32, 64, 128, 256):
        q, k = torch.randn(4096, d, generator=g), torch.randn(4096, d, generator=g)
        dots = (q * k).sum(-1)  # (4096,)
        rnd.append((d, float(dots.std()), float((dots / math.sqrt(d)).std())))
    tok = rows / bert.config.num_attention_heads
    return S3Result(
        entropy_scaled=(acc["es"] / rows).tolist(), entropy_unscaled=(acc["eu"] / rows).tolist(),
        max_scaled=(acc["ms"] / rows).tolist(), max_unscaled=(acc["mu"] / rows).tolist(),
        ln_t=ln_t / tok, random=rnd, head_size=D)


# --------------------------------------------------------------------------------------- S4
@dataclass(frozen=True)
class S4Result:
    """A short text alone, and in a batch padded to a longer one's length.

    masked_max_diff:   max |Δ| of its real tokens' outputs, padded with the mask vs alone
    unmasked_max_diff: the same with PAD attended (mask all ones)
    unmasked_min_cos:  the lowest cosine between a real token's output alone and with PAD attended
    pad_weight_masked / pad_weight_unmasked: mean attention mass real tokens give PAD keys
    """

    short: str
    long: str
    pads: int
    masked_max_diff: float
    unmasked_max_diff: float
    unmasked_min_cos: float
    pad_weight_masked: float
    pad_weight_unmasked: float


@analysis
def s4_padding(bert: Bert, short: str = "The cat sat.",
               long: str = "The animal didn't cross the street because it was too tired.") -> S4Result:
    dev = bert.device
    alone = bert.encode([short])
    n = alone.input_ids.shape[1]
    ref = bert.encoder(alone.input_ids.to(dev), alone.attention_mask.to(dev)).last_hidden_state[0]  # (n, C)
    both = bert.encode([short, long])
    ids, mask = both.input_ids.to(dev), both.attention_mask.to(dev)  # (2, T)
    pads = int((mask[0] == 0).sum())
    res = {}
    for name, m in (("masked", mask), ("unmasked", torch.ones_like(mask))):
        out = bert.encoder(ids, m, output_attentions=True)
        h = out.last_hidden_state[0, :n]  # (n, C)
        pad_cols = (mask[0] == 0)
        w = torch.stack([a[0][:, :n][..., pad_cols].sum(-1).mean() for a in out.attentions]).mean()
        res[name] = (float((h - ref).abs().max()), float(F.cosine_similarity(h, ref, dim=-1).min()), float(w))
    return S4Result(short=short, long=long, pads=pads, masked_max_diff=res["masked"][0],
                    unmasked_max_diff=res["unmasked"][0], unmasked_min_cos=res["unmasked"][1],
                    pad_weight_masked=res["masked"][2], pad_weight_unmasked=res["unmasked"][2])


# --------------------------------------------------------------------------------------- S11
@dataclass(frozen=True)
class S11Result:
    """Permute a text's tokens (a fixed, seeded shuffle) and compare out(P·x) with P·out(x).

    attention_max_diff:  one attention module (layer 0) on the embeddings: max |Δ|
    no_position_max_diff: the whole encoder with its position embeddings set to zero: max |Δ|
    position_max_diff:   the real encoder (position embeddings on): max |Δ|
    position_mean_cos:   mean cosine per token between out(P·x) and P·out(x), positions on
    embedding_cos_*:     cosine of the sentence embeddings of the text and its shuffle
    """

    text: str
    permutation: list[int]
    attention_max_diff: float
    no_position_max_diff: float
    position_max_diff: float
    position_mean_cos: float
    embedding_cos_no_position: float
    embedding_cos_position: float


@analysis
def s11_permutation(bert: Bert, text: str = TIRED, seed: int = 0) -> S11Result:
    dev = bert.device
    batch = bert.encode([text])
    ids, types = batch.input_ids.to(dev), batch.token_type_ids.to(dev)  # (1, T)
    T = ids.shape[1]
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(T, generator=g)
    while bool((perm == torch.arange(T)).all()) and T > 1:
        perm = torch.randperm(T, generator=g)
    perm_d = perm.to(dev)
    model = bert.encoder
    # attention alone
    x = model.embeddings(ids, types)  # (1, T, C)
    attn = model.layers[0].attention
    a, _ = attn(x)  # (1, T, C)
    ap, _ = attn(x[:, perm_d])  # (1, T, C)
    att_diff = float((ap - a[:, perm_d]).abs().max())

    def enc(m, i):
        return m(i, token_type_ids=types).last_hidden_state[0]  # (T, C)

    def emb_cos(h1, h2):
        return float(torch.dot(F.normalize(h1.mean(0), dim=0), F.normalize(h2.mean(0), dim=0)))

    nopos = copy.deepcopy(model)
    nopos.embeddings.position_embeddings.weight.zero_()
    h, hp = enc(nopos, ids), enc(nopos, ids[:, perm_d])
    nopos_diff = float((hp - h[perm_d]).abs().max())
    nopos_emb = emb_cos(h, hp)
    h, hp = enc(model, ids), enc(model, ids[:, perm_d])
    pos_diff = float((hp - h[perm_d]).abs().max())
    pos_cos = float(F.cosine_similarity(hp, h[perm_d], dim=-1).mean())
    return S11Result(text=text, permutation=perm.tolist(), attention_max_diff=att_diff,
                     no_position_max_diff=nopos_diff, position_max_diff=pos_diff, position_mean_cos=pos_cos,
                     embedding_cos_no_position=nopos_emb, embedding_cos_position=emb_cos(h, hp))


# --------------------------------------------------------------------------------------- S12
@dataclass(frozen=True)
class S12Result:
    """Word-level attention from "it" to "animal" and to "street", per head, in both sentences.

    tired / wide: (N, H, 2) [to animal, to street]. A head *follows the referent* when "it" attends
    more to "animal" in the tired sentence and more to "street" in the wide one.
    """

    tired: torch.Tensor
    wide: torch.Tensor
    top: list[tuple[int, int, float]]  # heads ranked by it -> animal in the tired sentence
    follows: list[tuple[int, int]]  # heads that follow the referent
    follows_strong: list[tuple[int, int]]  # ... and give the referent >= 0.1 in both sentences


@analysis
def s12_referent(bert: Bert, k: int = 5) -> S12Result:
    rows = {}
    for name, text in (("tired", TIRED), ("wide", WIDE)):
        r = attend(bert, text, "it")
        ia, ist = r.words.index("animal"), r.words.index("street")
        rows[name] = torch.stack([r.weights[:, :, ia], r.weights[:, :, ist]], -1)  # (N, H, 2)
    t, w = rows["tired"], rows["wide"]
    H = t.shape[1]
    flat = t[:, :, 0].flatten()
    top = [(i // H, i % H, float(flat[i])) for i in flat.argsort(descending=True)[:k].tolist()]
    fol = (t[:, :, 0] > t[:, :, 1]) & (w[:, :, 1] > w[:, :, 0])  # (N, H)
    strong = fol & (t[:, :, 0] >= 0.1) & (w[:, :, 1] >= 0.1)
    pairs = lambda m: [(int(a), int(b)) for a, b in m.nonzero().tolist()]  # noqa: E731
    return S12Result(tired=t, wide=w, top=top, follows=pairs(fol), follows_strong=pairs(strong))


# --------------------------------------------------------------------------------------- errata
def flops_per_forward(config: BertConfig, length: int) -> dict[str, float]:
    """Multiply-adds x 2 of one encoder forward of one sequence (embeddings and pooler left out),
    split as :meth:`BertConfig.flop_terms` splits them.

    linear: Q, K, V, O projections and the feed-forward (grow with L); attention: Q·Kᵀ and
    weights·V (grow with L²).
    """
    linear, attention = config.flop_terms([length])
    return {"linear": linear, "attention": attention, "total": linear + attention}


@dataclass(frozen=True)
class Errata:
    scores: list[float]
    seed_softmax: list[float]
    softmax: list[float]
    implied_scale: list[float]  # the scale s with softmax(s·x) matching each ratio of the seed's numbers
    flops_192: dict[str, float]
    flops_512: dict[str, float]

    @property
    def attention_ratio(self) -> float:
        return self.flops_512["attention"] / self.flops_192["attention"]

    @property
    def total_ratio(self) -> float:
        return self.flops_512["total"] / self.flops_192["total"]


def errata() -> Errata:
    x = torch.tensor([0.9, 0.1, 0.3], dtype=torch.float64)
    seed = [0.73, 0.05, 0.22]
    p = torch.softmax(x, 0)
    # softmax(s·x)_i / softmax(s·x)_j = exp(s·(x_i - x_j)): each pair implies its own s
    implied = [math.log(seed[0] / seed[1]) / float(x[0] - x[1]), math.log(seed[0] / seed[2]) / float(x[0] - x[2])]
    base = BertConfig.preset("bert-base")
    return Errata(scores=x.tolist(), seed_softmax=seed, softmax=p.tolist(), implied_scale=implied,
                  flops_192=flops_per_forward(base, 192), flops_512=flops_per_forward(base, 512))
