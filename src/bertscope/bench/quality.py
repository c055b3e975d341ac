"""How close reduced-precision embeddings stay to fp32: the int8 quality contract.

Shape legend: N texts, C embedding size; rows are unit vectors.

    cosine to fp32        per text, cos(e_int8, e_fp32); the contract asks mean >= 0.99, min >= 0.97
    top-10 overlap        every text as a query against all the others: the share of its 10 nearest
                          neighbours (cosine) under fp32 that are also among its 10 under int8,
                          averaged over the queries; the contract asks >= 0.9
    speed                 >= 2x sentence-transformers fp32 and >= 1.0x ONNX Runtime dynamic int8
                          (per-channel), on the same corpus in the same run; bench judges it by
                          the paired speed-up (median over rounds of the per-round time ratio)
"""

from __future__ import annotations

import numpy as np

__all__ = ["INT8_CONTRACT", "contract_verdict", "embedding_agreement", "top_k_overlap"]

INT8_CONTRACT = {"cosine_mean": 0.99, "cosine_min": 0.97, "top10_overlap": 0.9,
                 "speedup_vs_sentence_transformers": 2.0, "speedup_vs_onnxruntime_int8": 1.0}


def top_k_overlap(ref: np.ndarray, got: np.ndarray, k: int = 10) -> float | None:
    """Mean share of each text's k nearest neighbours under ``ref`` kept under ``got`` (itself
    excluded); None for k + 1 texts or fewer, where every other text is a neighbour and the
    overlap is 1 whatever the embeddings (it was reported as 1.0: a term that could not fail)."""
    n = ref.shape[0]
    if n <= k + 1:
        return None

    def neighbours(e: np.ndarray) -> np.ndarray:
        sim = e @ e.T  # (N, N) cosine of unit rows
        np.fill_diagonal(sim, -np.inf)  # a text is not its own neighbour
        return np.argpartition(-sim, k - 1, axis=1)[:, :k]  # (N, k), any order

    a, b = neighbours(ref), neighbours(got)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a.tolist(), b.tolist())]))


def embedding_agreement(ref: np.ndarray, got: np.ndarray, k: int = 10) -> dict:
    """Cosine to the reference (mean, min) and top-k neighbour overlap of two (N, C) unit-row arrays."""
    ref, got = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)  # a float32 mean
    # of cosines all near 1 can round below their minimum (seen on an AVX2-limited run)
    cos = (ref * got).sum(1) / np.clip(np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1), 1e-12, None)
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
            f"top{k}_overlap": top_k_overlap(ref, got, k), "texts": int(ref.shape[0])}


def contract_verdict(agreement: dict, speedups: dict[str, float | None]) -> dict:
    """Each term of INT8_CONTRACT with its measured value and whether it holds (None: not measured)."""
    measured = {**{k: agreement.get(k) for k in ("cosine_mean", "cosine_min", "top10_overlap")},
                "speedup_vs_sentence_transformers": speedups.get("sentence-transformers"),
                "speedup_vs_onnxruntime_int8": speedups.get("onnxruntime int8")}
    return {k: {"required": INT8_CONTRACT[k], "measured": v, "holds": None if v is None else bool(v >= INT8_CONTRACT[k])}
            for k, v in measured.items()}
