"""Seeing attention: aggregation over heads and layers, the HTML explorer (of bertscope's model,
or of any model's attention: show), the web app, and every figure (the only place matplotlib
is imported)."""
