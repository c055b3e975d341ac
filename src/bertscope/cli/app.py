"""Entry point: ``bertscope COMMAND ...``.

Every command lives in its own module in this package and exposes ``register(subparsers)``;
add new commands to ``COMMAND_MODULES``. Errors meant for the user (BertscopeError, and bad
values) print one line, ``bertscope: error: ...``, and exit with status 2; an unexpected failure
prints one line too. ``--debug`` shows the traceback before that line; the exit status stays.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import io
import logging
import os
import signal
import sys
import traceback
import warnings
from typing import NoReturn, Sequence

from .. import __version__
from ..errors import NO_SPACE, BertscopeError, as_typed, no_space, os_reason

COMMAND_MODULES = [
    "params", "attend",  # core
    "embed", "bench", "doctor",  # fast
    "view", "plot", "serve",  # see attention
    "trace", "heads", "coref", "ablate", "experiments",  # understand heads
    "finetune", "predict",  # train
    "explain", "explain_experiments",  # what tokens take from each other
]

DESCRIPTION = """\
bertscope: BERT's multi-head self-attention, built from scratch, exact on real checkpoints,
and made visible. Every command works offline on the bundled all-MiniLM-L6-v2 checkpoint,
or on any local Hugging Face-format BERT folder given with --model.

examples:
  bertscope attend "The animal didn't cross the street because it was too tired" --token it
  bertscope params --preset bert-base
  bertscope embed texts.txt --out texts.emb
  bertscope finetune train.csv --dev dev.csv --out sentiment/
  bertscope bench --json
  bertscope doctor
  bertscope COMMAND --help
"""


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message)
    if text.startswith("bertscope: "):  # the library names itself for Python users; the CLI once
        text = text[len("bertscope: "):]
    print(f"bertscope: warning: {as_typed(_one_line(text))}", file=sys.stderr)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, ``kill``, a container stopping): stops the command as Ctrl-C does, so
    its cleanup runs (a job's lock released, a half-written file removed) and it says so."""


def _raise_terminated(signum, frame) -> NoReturn:
    raise _Terminated()


def _stop_on_sigterm():
    """Turn SIGTERM into :class:`_Terminated` while a command runs; the handler it replaced (to
    restore), or None where signals cannot be set (not the main thread)."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:
        return None
    return signal.SIG_DFL if previous is None else previous  # None: one set outside Python


def _resumable(args: argparse.Namespace) -> bool:
    """Whether a stopped command left something for --resume to finish: a command that can
    resume says so with ``set_defaults(resumable=FUNCTION(args) -> bool)``; before its first
    checkpoint (or job file) there is nothing to resume, and the hint would only fail."""
    check = getattr(args, "resumable", None)
    if check is None:
        return False
    try:
        return bool(check(args))
    except Exception:  # an unreadable folder: no hint rather than a traceback
        return False


STDOUT_NAME = "standard output"


class _StdoutFile(io.FileIO):
    """File descriptor 1, whose errors name it (an OSError from a write has no file name). Once
    ``discard`` is set, what is still buffered is dropped: a write that failed was reported."""

    discard = False
    failed = False  # a write failed (and the command said so)

    def write(self, b) -> int:
        if self.discard:
            return len(b)
        try:
            return super().write(b)
        except OSError as e:
            self.failed = True
            if e.filename is None:
                e.filename = STDOUT_NAME
            raise


def _checked_stdout():
    """A stdout that reports a failed write, or None to keep the one there is.

    Under PYTHONUNBUFFERED=1 (set in many containers) Python's stdout ignores a short write: a
    table written to a full disk lost its end, and the command exited 0. This one buffers, so a
    short write is retried until the disk says why. It flushes at each line where the stdout it
    stands for did (a terminal, or PYTHONUNBUFFERED). Only the process's own stdout is replaced
    (not a test's capture)."""
    out = sys.stdout
    if os.name != "posix":  # a Windows console's own stdout object is kept
        return None
    try:
        if out is not sys.__stdout__ or out.fileno() != 1:
            return None
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None
    out.flush()
    unbuffered = isinstance(getattr(out, "buffer", None), io.RawIOBase)
    return io.TextIOWrapper(io.BufferedWriter(_StdoutFile(1, "wb", closefd=False)), encoding=out.encoding,
                            errors=out.errors, line_buffering=out.line_buffering or unbuffered)


def _no_space(e: BaseException | None) -> bool:
    """A full disk, or a full disk quota: the error, one it was raised from, or a library error
    that says so (numpy's short write carries no errno; embed's error names the file)."""
    for _ in range(4):
        if e is None:
            return False
        if no_space(e):
            return True
        if isinstance(e, BertscopeError) and NO_SPACE in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


_REFUSED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def _refused(e: BaseException) -> bool:
    """A file the system refused mid-run (permissions changed, a folder made read-only, a mount
    remounted read-only): what the command checked writable before it began no longer is."""
    return isinstance(e, OSError) and e.errno in _REFUSED and bool(e.filename)


def _write_failure(e: OSError) -> str | None:
    """The one line for a failed write that is not the user's doing to fix by other input: a
    full disk, named by the file (or standard output), or a file the system refused mid-run
    (named, with the system's words); None for other errors."""
    if _no_space(e):
        return f"cannot write {e.filename or 'the output'}: {NO_SPACE}"
    if e.filename == STDOUT_NAME:
        return f"cannot write {STDOUT_NAME}: {e.strerror or e}"
    if _refused(e):  # an output as a rule, but embed reads its input shard by shard: not "write"
        return f"{e.filename}: {os_reason(e)}"
    return None


class _LogLine(logging.Formatter):
    """Log records as the CLI's own warnings and errors read: "bertscope: warning: ..."."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"bertscope: {record.levelname.lower()}: {as_typed(_one_line(record.getMessage()))}"
        if record.exc_info and record.exc_info[1] is not None:  # the exception in brief; --debug shows all
            e = record.exc_info[1]
            line += f" ({type(e).__name__}: {_one_line(e)})" if str(e).strip() else f" ({type(e).__name__})"
        return line


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (exit 2), like every other error."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        hint = f"{self.prog} --help"
        self.exit(2, f"bertscope: error: {_one_line(message)} (see {hint})\n")


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _split_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    """Accept --debug anywhere before a bare '--' (before or after the command)."""
    out, debug, literal = [], False, False
    for a in argv:
        if a == "--":
            literal = True
        if a == "--debug" and not literal:
            debug = True
            continue
        out.append(a)
    return out, debug


# options that explain an empty value their own way (--token: "the word is empty", ...)
EMPTY_SAID_ELSEWHERE = {"out", "token", "measure", "host", "allow_host", "span", "pair", "similar_to"}


def check_arguments(args: argparse.Namespace, command: argparse.ArgumentParser | None = None) -> None:
    """Refuse, in one line, any argument that is not valid Unicode text, and an empty value
    given to an option of ``command`` (``--model ""`` read as the folder "."; ``--preset ""`` and
    ``--field ""`` as if left out).

    Python decodes argv with "surrogateescape": a byte that is not UTF-8 (say 0xff, from a
    Latin-1 terminal) arrives as a lone surrogate (U+DCFF) that no tokenizer, JSON writer or
    file system call downstream accepts. Checked here once, for every command and every
    argument (texts, words, paths, field names), before any work.
    """
    for dest, value in vars(args).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if not isinstance(v, str):
                continue
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                code = ord(v[e.start])
                what = (f"byte 0x{code - 0xDC00:02x}, which is not UTF-8," if 0xDC80 <= code <= 0xDCFF
                        else f"a lone surrogate U+{code:04X}")
                raise BertscopeError(f"{_as_typed_name(dest, command)} holds {what} at character "
                                     f"{e.start}; bertscope takes UTF-8 text and file names") from None
    for action in [] if command is None else command._actions:
        if not action.option_strings or action.dest in EMPTY_SAID_ELSEWHERE:
            continue
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values) and value != action.default:
            raise BertscopeError(f"{action.option_strings[0]} is empty; give {action.metavar or action.dest.upper()}")


def _as_typed_name(dest: str, command: argparse.ArgumentParser | None) -> str:
    """An argument as the user typed it: its flag (--token), or a positional's metavar (TEXT)."""
    for action in [] if command is None else command._actions:
        if action.dest == dest:
            if action.option_strings:
                return action.option_strings[0]
            return action.metavar if isinstance(action.metavar, str) else dest.upper()
    return f"argument {dest.replace('_', '-')}"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="bertscope", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"bertscope {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks and debug logs (also accepted after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of ``command`` (the top-level one where there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


class _HeldInterrupt:
    """Ctrl-C held back while torch imports, then acted on.

    An interrupt inside ``import torch`` leaves a half-imported torch: the next import of it
    aborts the process from C++ ("cannot initialize type ...") or segfaults, and numpy's import
    from torch's C code can swallow the interrupt whole. So while this is active, SIGINT is only
    noted; ``hit`` says whether one came. Where signals cannot be set (not the main thread),
    nothing changes."""

    def __init__(self) -> None:
        self.hit = False
        self.active = False
        self.previous = None

    def _note(self, signum, frame) -> None:
        if self.hit:  # a second Ctrl-C: the import hangs (a slow disk), the user insists: stop now
            self.__exit__()  # (the command does not run: torch, half imported, is not imported again)
            raise KeyboardInterrupt
        self.hit = True

    def __enter__(self) -> "_HeldInterrupt":
        try:
            self.previous = signal.signal(signal.SIGINT, self._note)
        except ValueError:
            return self
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        if self.active:  # None: a handler set outside Python, which Python cannot put back
            self.active = False
            signal.signal(signal.SIGINT, signal.default_int_handler if self.previous is None else self.previous)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before the command began (its own are said by _run): one line
        print("bertscope: interrupted", file=sys.stderr)
        return 130


def _import_torch() -> None:
    """numpy and torch, whole, before any command runs (see _HeldInterrupt): the first second."""
    import numpy  # noqa: F401  (first: torch's C code imports it, and can lose an interrupt there)
    import torch  # noqa: F401


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()  # light: the commands import what they need when they run
    argv, debug = _split_debug(sys.argv[1:] if argv is None else list(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:  # an unknown flag: say so with the help of the command it was given to
        shown = " ".join(a for a in extra if a != "--")
        _command_parser(parser, args.command).error(f"unrecognized arguments: {shown}")
    args.debug = args.debug or debug
    if args.command is None:  # a usage error: the help goes where errors go, stdout stays clean
        parser.print_help(sys.stderr)
        return 2
    handler = logging.StreamHandler()  # stderr
    handler.setFormatter(logging.Formatter("bertscope: %(levelname)s: %(name)s: %(message)s") if args.debug
                         else _LogLine())
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, handlers=[handler])
    warnings.showwarning = _warning_line
    try:
        with _HeldInterrupt() as held:
            _import_torch()
    except Exception as e:  # a broken install: one line (doctor, which would say more, needs torch too)
        if args.debug:
            traceback.print_exc()
        print(f"bertscope: error: cannot import torch ({type(e).__name__}: {_one_line(e)[:300]}); "
              "reinstall it as the README says (pip install torch==2.13.0)", file=sys.stderr)
        return 1
    if held.hit:
        raise KeyboardInterrupt
    stdout = _checked_stdout()
    if stdout is None:
        return _run(args, parser)
    sys.stdout = stdout
    try:
        code = _run(args, parser)
        stdout.buffer.raw.discard = stdout.buffer.raw.failed  # said once, by the command's own line
        try:
            stdout.flush()
        except BrokenPipeError:
            pass
        except KeyboardInterrupt:
            print("bertscope: interrupted", file=sys.stderr)
            code = code or 130
        except OSError as e:
            print(f"bertscope: error: {_write_failure(e) or _one_line(e)}", file=sys.stderr)
            code = code or 2
        return code
    finally:
        sys.stdout = sys.__stdout__
        stdout.buffer.raw.discard = True  # flushed above, or a failure said: what is left is dropped
        stdout.detach()


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The command, with every failure turned into one line on stderr and an exit status."""
    previous = _stop_on_sigterm()
    try:
        check_arguments(args, _command_parser(parser, args.command))
        return int(args.func(args) or 0)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (_Terminated): what was written is kept
        return _stopped(e, args, previous)
    except Exception as e:
        stop = _interrupt_behind(e)
        if stop is not None:  # a library's own error, raised while the interrupt unwound through it
            if args.debug:
                traceback.print_exc()
            return _stopped(stop, args, previous)
        return _failed(e, args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stopped(e: KeyboardInterrupt, args: argparse.Namespace, previous) -> int:
    """The one line for Ctrl-C (130) or SIGTERM (143), with the --resume hint where it applies."""
    if previous is not None:  # a second SIGTERM from here on is not raised as a traceback
        signal.signal(signal.SIGTERM, previous)
    resume = "; rerun the same command with --resume to finish" if _resumable(args) else ""
    print(f"bertscope: {'terminated' if isinstance(e, _Terminated) else 'interrupted'}{resume}", file=sys.stderr)
    return 143 if isinstance(e, _Terminated) else 130


def _interrupt_behind(e: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM an error was raised while handling, if any: torch.save interrupted
    inside its zip writer raises RuntimeError("[enforce fail at inline_container.cc] unexpected
    pos ...") from its cleanup, and that, not the interrupt, reached the command."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _failed(e: Exception, args: argparse.Namespace) -> int:
    """The one line for a failure: 2 for bertscope's errors and a full disk, 0 for a closed
    pipe, 1 for anything unexpected. A full disk under a command that can resume says how to
    finish, as a Ctrl-C does: what was written before is kept."""
    debug = args.debug
    if isinstance(e, BrokenPipeError):
        return 0
    line = (as_typed(_one_line(e)) if isinstance(e, BertscopeError)
            else _write_failure(e) if isinstance(e, OSError) else None)
    if line is None:  # an unexpected failure still gets one line, not a traceback
        return _unexpected(e, debug)
    if _no_space(e) and _resumable(args):
        line += "; free some space, then rerun the same command with --resume to finish"
    elif _refused(e) and _resumable(args):
        line += "; once that is fixed, rerun the same command with --resume to finish"
    if debug:  # the traceback, then the same line and exit status as without --debug
        traceback.print_exc()
    print(f"bertscope: error: {line}", file=sys.stderr)
    return 2


def _unexpected(e: BaseException, debug: bool) -> int:
    """An unexpected failure still gets one line, not a traceback."""
    if debug:
        traceback.print_exc()
    msg = _one_line(e)[:300]
    hint = "" if debug else " (rerun with --debug for details)"  # with --debug, the traceback is above
    print(f"bertscope: error: {type(e).__name__}: {msg}{hint}", file=sys.stderr)
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
