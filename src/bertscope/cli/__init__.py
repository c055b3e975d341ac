"""bertscope's command line. Commands are thin: they parse, call the library, and print.

The entry point is :func:`bertscope.cli.main.main` (the ``bertscope`` script and
``python -m bertscope``). It is not bound here: a package attribute ``main`` would hide the
module of that name (``import bertscope.cli.main as m`` gave the function).
"""
