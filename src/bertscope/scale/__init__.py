"""Scale-out on Ray: the embedding job on a pool of model-holding actors, ``embed_dataset`` for
Ray Data pipelines, and per-head corpus statistics as per-shard sums merged exactly.

Ray is optional (``pip install 'bertscope[ray]'``) and imported only when one of these runs.
"""

from __future__ import annotations

from .cluster import EngineOptions
from .embed import embed_dataset, run_ray_embed_job
from .heads import ray_head_stats

__all__ = ["EngineOptions", "embed_dataset", "ray_head_stats", "run_ray_embed_job"]
