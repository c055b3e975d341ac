"""HF transformers used naively: batches of 32 in input order, padded to their longest, SDPA attention."""

from __future__ import annotations

import numpy as np
import torch

NAME = "transformers"
ORDER = 2
DEVICES = ("cpu", "cuda")


def build(setup):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(setup.folder))
    model = transformers.AutoModel.from_pretrained(str(setup.folder), attn_implementation="sdpa").eval().to(setup.device)
    if setup.dtype is not None:
        model.to(setup.dtype)

    @torch.inference_mode()
    def run(texts):
        out = []
        for a in range(0, len(texts), 32):
            enc = tok(list(texts[a:a + 32]), padding=True, truncation=True, max_length=setup.max_len,
                      return_tensors="pt").to(setup.device)
            h = model(**enc).last_hidden_state  # (B, T, C)
            m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)  # (B, T, 1)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (B, C)
            out.append(torch.nn.functional.normalize(pooled.float(), dim=1).cpu().numpy())
        return np.concatenate(out)

    return run
