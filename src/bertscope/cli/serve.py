"""bertscope serve: the attention explorer as a local web app."""

from __future__ import annotations

import argparse

from .common import add_model_arg, load_model

HELP = """\
Serve the attention explorer on this machine: a text box and the same head, model and matrix
views as `bertscope view`, computed on demand (only the layer and heads you look at travel).
Binds to 127.0.0.1 unless --host says otherwise; texts longer than --max-chars get HTTP 413.
Needs FastAPI and uvicorn (pip install 'bertscope[serve]'). Stop it with Ctrl-C.

examples:
  bertscope serve                       # then open http://127.0.0.1:8000/
  bertscope serve --port 8080 --max-chars 5000
  bertscope serve --model ./my-bert-folder --host 0.0.0.0   # reachable from other machines
"""


def register(sub) -> None:
    p = sub.add_parser("serve", help="the attention explorer as a local web app", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-chars", type=int, default=2000, metavar="N",
                   help="longest text accepted, in characters (default 2000); longer gets HTTP 413")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from ..errors import InputError
    from ..server import run as serve

    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be 0..65535, got {args.port}")
    if args.max_chars < 1:
        raise InputError("--max-chars must be at least 1")
    bert = load_model(args)
    print(f"bertscope: serving {bert.name} on http://{args.host}:{args.port}/ (Ctrl-C stops)",
          file=sys.stderr, flush=True)
    serve(bert, host=args.host, port=args.port, max_chars=args.max_chars)
    return 0
