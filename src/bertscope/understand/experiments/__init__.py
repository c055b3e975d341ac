"""The seed's claims measured on a real checkpoint (claims) and written up as docs/EXPERIMENTS.md (report)."""
