"""Errors that bertscope raises for bad input, and the warnings it gives. The CLI prints each as
one line."""

from __future__ import annotations

import errno
import operator
import os
import sys
import warnings

__all__ = ["BertscopeError", "CheckpointError", "InputError", "InputTypeError", "NonFiniteError", "as_count",
           "as_index", "as_typed", "as_whole_number", "check_seed", "setting", "warn_caller"]


class BertscopeError(Exception):
    """Base of every error bertscope raises on purpose; its message is one plain sentence."""


class CheckpointError(BertscopeError):
    """A model folder that is missing, not a checkpoint, or whose weights do not fit."""


class InputError(BertscopeError, ValueError):
    """Bad user input: empty text, a word not in the text, a malformed file."""


class InputTypeError(InputError, TypeError):
    """Input of the wrong kind: one string where a list is wanted, None or a number for a text."""


class NonFiniteError(BertscopeError):
    """The model computed NaN or infinity (e.g. fp16 overflow); nothing is returned or written."""


NO_SPACE = "no space left on the device"  # how every message says a full disk (the CLI looks for it)


def no_space(e: BaseException) -> bool:
    """Whether ``e`` is a full disk, or a full disk quota."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def os_reason(e: OSError) -> str:
    """Why an OSError failed, for a message: a full disk (or quota) as :data:`NO_SPACE`, else the
    system's words ("Permission denied")."""
    return NO_SPACE if no_space(e) else e.strerror or str(e)


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SAID: dict[str, str] = {}  # "max_length (--max-length)" -> "--max-length", as messages named them


def setting(name: str, flag: str) -> str:
    """A setting as both callers know it, for a message the library and the CLI share:
    ``setting("max_length", "--max-length")`` is "max_length (--max-length)". The CLI prints
    only the flag (:func:`as_typed`)."""
    both = f"{name} ({flag})"
    _SAID[both] = flag
    return both


def as_typed(message: str) -> str:
    """``message`` in the command line's words: each setting named by :func:`setting` becomes
    its flag alone, "--max-length must be ..."; nothing else in it changes (a path or word the
    user wrote that happens to look like "x (X)" stays as written)."""
    for both, flag in list(_SAID.items()):  # a copy: another thread may name a setting meanwhile
        if both in message:
            message = message.replace(both, flag)
    return message


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the user's line that called into bertscope, however deep
    inside bertscope it is raised (as Python 3.12's ``skip_file_prefixes`` does). Python shows a
    warning once per place: attributed to a line of bertscope, the first truncation warning of
    a session hid every later one, whichever function the user called."""
    level, frame = 2, sys._getframe(1)  # stacklevel 2 is the frame that called this function
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def as_whole_number(value: object) -> int | None:
    """``value`` as an int if it is a whole number (an int, a numpy integer, a 0-d integer
    tensor; not a bool, a float or a string), else None: the callers word their own errors."""
    if isinstance(value, bool):
        return None
    if getattr(value, "ndim", 0) != 0:  # torch gives a 1-element tensor of any shape an index
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def bad_whole(n: int | None, message: str) -> InputError:
    """The error for a value that had to be a whole number in some range, given ``n``, what
    :func:`as_whole_number` made of it: an InputTypeError (also a TypeError) when it is None, the
    value being of the wrong kind (a float, a string, a bool), as Python's ``[]`` says; else an
    InputError (a ValueError), the number being out of range."""
    return (InputTypeError if n is None else InputError)(message)


def as_index(name: str, value: object, size: int) -> int:
    """``value`` as an index into ``size`` things, 0..size-1; negatives count from the end, as in
    Python, and come back as the same index counted from the start. Anything else (a float, a
    string, a bool, out of range) is an InputError that names ``name`` and the range: an
    InputTypeError (also a TypeError) for a value that is not a whole number at all."""
    n = as_whole_number(value)
    if n is None or not -size <= n < size:
        raise bad_whole(n, f"{name} must be a whole number from 0 to {size - 1} (or -{size} to -1, "
                         f"counted from the end), got {value!r}")
    return n % size


def as_count(value: object, name: str = "k") -> int:
    """``value`` as a whole number >= 1 (how many to return), else an InputError (an
    InputTypeError for a float, a string or a bool)."""
    n = as_whole_number(value)
    if n is None or n < 1:
        raise bad_whole(n, f"{name} must be a whole number >= 1, got {value!r}")
    return n


def check_seed(seed: object, name: str = "seed", flag: str = "--seed") -> int:
    """``seed`` if it is a whole number torch's generators take (0 to 2**64 - 1; numpy's take no
    negative one either), else an InputError naming it as ``name`` (``flag``): an
    InputTypeError for a float, a string or a bool."""
    n = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
    if n is None or not 0 <= n < 2 ** 64:
        raise bad_whole(n, f"{setting(name, flag)} must be a whole number from 0 to 2**64 - 1, got {seed!r}")
    return seed
