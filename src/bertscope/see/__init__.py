"""Seeing attention: aggregation over heads and layers, the HTML explorer, the web app, and
every figure (the only place matplotlib is imported)."""
