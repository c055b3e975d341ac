"""Helpers shared by the commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

MODEL_HELP = ("a local Hugging Face-format BERT folder (config.json, model.safetensors or "
              "pytorch_model.bin, tokenizer.json or vocab.txt); default: the bundled all-MiniLM-L6-v2")


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", default=None, help=MODEL_HELP)


def load_model(args: argparse.Namespace, *, precision: str | None = None,
               keep_precision: bool | None = None):
    """The model ``args`` asks for (--model, --precision, --compile, --keep-precision).
    ``precision`` and ``keep_precision``, where given, replace the flags' values (a run that
    must continue a job in the precision it began with); one other than int8 drops --compile."""
    from ..bert import load

    compile = getattr(args, "compile", False)
    if precision is None:
        precision = getattr(args, "precision", "fp32")
    elif precision != "int8":
        compile = False
    if keep_precision is None:
        keep_precision = getattr(args, "keep_precision", False)
    return load(getattr(args, "model", None), precision=precision, compile=compile,
                keep_precision=keep_precision)


def check_preset(name: str | None) -> None:
    """A --preset that names no known configuration is an InputError (one line listing them)."""
    if name:
        from ..core.config import BertConfig
        from ..errors import InputError

        try:
            BertConfig.preset(name)
        except ValueError as e:
            raise InputError(str(e)) from None


def page_measures(values: list[str] | None, default: tuple[str, ...] = ()) -> list[str]:
    """The measures a page's Measure switch offers, from --measure ``values`` (``default`` when
    the flag is absent). The attention weights are always on the page, and so is their rollout
    (the Attention control's "rollout" mode, the same map as the rollout measure): neither is
    offered again. Rollout named on its own gets a note on stderr saying where it is."""
    from ..explain import parse_measures

    names = parse_measures(values) if values is not None else list(default)
    named = values is not None and any(part.strip() == "rollout" for v in values for part in v.split(","))
    if named:
        print("bertscope: note: rollout is always on the page: the Attention control's rollout mode "
              "(not offered again as a measure)", file=sys.stderr)
    return [m for m in names if m not in ("attention", "rollout")]


def print_json(obj: Any) -> None:
    """Strict JSON on stdout (NaN/Infinity are refused before anything is written)."""
    from .guard import print_json_strict

    print_json_strict(obj)


def check_output_file(value: str, flag: str = "--out", suffixes: tuple[str, ...] = ()) -> Path:
    """Check an output FILE path before any work is done: right suffix, not a folder, and a
    folder to write it in that exists and is writable. Raises InputError (one line)."""
    import os

    from ..errors import InputError

    if value == "-":  # the shell's name for standard output: not a file name here
        raise InputError(f"{flag} -: standard output is not written here; give a file name (./- for a file named -)")
    path = Path(value)
    if value.endswith(("/", os.sep)):  # Path() drops the slash that says "a folder"
        raise InputError(f"{flag} {value!r} names a folder (it ends in /); give a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        raise InputError(f"{flag} must end in {' or '.join(suffixes)}, got {value!r}")
    _check_name(path, flag)
    if path.is_dir():
        raise InputError(f"{flag} {value!r} is a folder; give a file name")
    from ..files import open_stream_fd, unwritable_kind

    if open_stream_fd(path) is not None:  # /dev/stdout and the like: written through the open stream
        return path
    if path.exists() and not path.is_file():  # /dev/null, a named pipe: written where it is
        kind = unwritable_kind(os.stat(path).st_mode)
        if kind is not None:
            raise InputError(f"{flag}: {value!r} is a {kind}, not a file")
        if not os.access(path, os.W_OK):
            raise InputError(f"{flag}: {value!r} is not writable")
        return path
    target = Path(os.path.realpath(path)) if path.is_symlink() else path  # written in its own folder
    folder = target.parent if str(target.parent) else Path(".")
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{flag}: {str(folder)!r} is a file, not a folder to write {target.name!r} in")
    if not folder.is_dir():
        raise InputError(f"{flag}: the folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{flag}: the folder {str(folder)!r} is not writable")
    from .guard import check_writable

    check_writable(target, flag)  # as root, permission bits say yes even in /proc
    return path


def _check_name(path: Path, flag: str) -> None:
    """InputError (one line) for a path the system cannot even look up: a name too long, a loop
    of links (Path.exists() and is_dir() raise those)."""
    import os

    from ..errors import InputError

    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as e:
        shown = str(path) if len(str(path)) <= 80 else str(path)[:80] + "..."
        raise InputError(f"{flag}: {e.strerror or e}: {shown!r}") from None


def check_output_dir(value: str, flag: str = "--out") -> Path:
    """Check an output FOLDER path before any work is done: not a file, and creatable or writable.
    Raises InputError (one line)."""
    import os

    from ..errors import InputError

    if not str(value).strip():  # "" would be the working folder: an unset $DIR in a script
        raise InputError(f"{flag} is an empty name; give a folder")
    if value == "-":  # the shell's name for standard output, never a folder: "-" would be made
        raise InputError(f"{flag} -: standard output is not a folder; give a folder name (./- for a folder named -)")
    path = Path(value)
    _check_name(path, flag)
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {value!r} is a file, not a folder")
    existing = path
    while not existing.exists():  # the nearest existing ancestor must be a writable folder
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{flag}: {str(existing)!r} is a file, so {value!r} cannot be a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{flag}: {str(existing)!r} is not writable")
    from .guard import check_writable

    return check_writable(path, flag, folder=True)


ENGINE_FLAGS = ("address", "workers", "cpus_per_worker", "gpus_per_worker")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """--engine local|ray and the Ray flags (--address, --workers, --cpus-per-worker, --gpus-per-worker)."""
    g = p.add_argument_group("engine (Ray needs: pip install 'bertscope[ray]')")
    g.add_argument("--engine", default="local", metavar="local|ray",
                   help="local: this process (default); ray: a pool of Ray actors, each holding the model")
    g.add_argument("--address", default=None, metavar="auto|HOST:PORT|ray://HOST:PORT",
                   help="the Ray cluster to join (default: RAY_ADDRESS's where that is set, else start Ray on "
                        "this machine and stop it after)")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="Ray actors, one model each (default: as many as the cluster's CPUs / --cpus-per-worker; "
                        "a Ray started here takes at most 4 workers, and 4 CPUs' worth of them, per CPU it can use)")
    g.add_argument("--cpus-per-worker", type=float, default=None, metavar="C",
                   help="CPUs per actor, also its torch threads (default 1)")
    g.add_argument("--gpus-per-worker", type=float, default=None, metavar="G",
                   help="GPUs per actor (default 0; fractions share a GPU); above 0 runs on CUDA")


def engine_options(args: argparse.Namespace):
    """The checked EngineOptions for --engine ray, or None for the local engine (one-line errors)."""
    from ..errors import InputError

    if args.engine not in ("local", "ray"):
        raise InputError(f"--engine must be local or ray, not {args.engine!r}")
    given = [f"--{f.replace('_', '-')}" for f in ENGINE_FLAGS if getattr(args, f) is not None]
    if args.engine == "local":
        if given:
            raise InputError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} --engine ray")
        return None
    from ..scale.cluster import EngineOptions, check_engine_options, check_local_capacity, require_ray

    opts = EngineOptions(address=args.address, workers=args.workers,
                         cpus_per_worker=1.0 if args.cpus_per_worker is None else args.cpus_per_worker,
                         gpus_per_worker=0.0 if args.gpus_per_worker is None else args.gpus_per_worker)
    check_engine_options(opts)
    check_local_capacity(opts)  # before any file is touched (the library checks again as Ray starts)
    require_ray()
    return opts


def run_script(main: Callable[[], int]) -> NoReturn:
    """Exit with a benchmark script's ``main()``: its status, or 2 with one line on stderr for a
    :class:`~bertscope.errors.BertscopeError` (a model folder that is not a checkpoint, and the
    like), as the ``bertscope`` command does."""
    from ..errors import BertscopeError

    try:
        sys.exit(main())
    except BertscopeError as e:
        print("error: " + " ".join(part.strip() for part in str(e).splitlines() if part.strip()), file=sys.stderr)
        sys.exit(2)
