"""bertscope's command line. Commands are thin: they parse, call the library, and print.

:func:`main` (from :mod:`bertscope.cli.app`, the parser and the one-line errors) is the
``bertscope`` script and ``python -m bertscope``. The module is not named ``main``: a package
attribute ``main``, the function, would hide it (``import bertscope.cli.main as m`` gave the
function).
"""

from .app import main

__all__ = ["main"]
