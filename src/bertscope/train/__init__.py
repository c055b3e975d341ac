"""Fine-tuning: train the from-scratch BERT as a sequence classifier (``bertscope finetune``).

data (CSV/TSV/JSON Lines records, label sets), batches (length-grouped, token budget),
loop (AdamW, warm-up and decay, clipping, atomic resumable checkpoints), output (HF folders),
metrics (accuracy, macro-F1), tradeoff (the max_length experiment).
"""

from .loop import FinetuneConfig, FinetuneResult, StepInfo, finetune

__all__ = ["FinetuneConfig", "FinetuneResult", "StepInfo", "finetune"]
