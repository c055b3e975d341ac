"""Understanding heads: where a word looks, step-by-step traces, per-head statistics,
pronoun resolution on WSC, ablation, and the seed's claims as experiments."""
