"""bertscope's command line. Commands are thin: they parse, call the library, and print."""

from .main import main

__all__ = ["main"]
