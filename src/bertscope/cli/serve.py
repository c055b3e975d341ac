"""bertscope serve: the attention explorer as a local web app."""

from __future__ import annotations

import argparse

from .common import add_model_arg, load_model, page_measures

HELP = """\
Serve the attention explorer on this machine: a text box and the same head, model, matrix and
query-key views as `bertscope view`, computed on demand (only the layer and heads you look at
travel). The page's JSON API: GET /api/health; POST /api/analyze, /api/attention, /api/qk, each
with a JSON body sent as Content-Type: application/json. The page opens on a sample text, shown
at once; its address holds the text shown (?text=..., with &text_b=... to compare a second text
or &pair=... for a sentence pair; not a text that makes it over 8,000 characters, which the page
says), so a link or a reload opens on that text, and Back and Forward go through the texts shown.
Binds to 127.0.0.1 unless --host says otherwise; an address in use or not this machine's is a
one-line error. Texts longer than --max-chars get HTTP 413. The last analyses are kept in memory
(at most 16, and at most 256 MiB of attention arrays).
Requests must name this server in their Host header (localhost, 127.0.0.1, [::1], the --host
address, or a name given with --allow-host); others get HTTP 421, so a web page elsewhere cannot
reach it through DNS rebinding. Binding to every interface (0.0.0.0 or ::) prints a warning.
The page's Measure switch also offers norm, norm-residual, value-zeroing and alti (bertscope
explain's map methods), each computed when first chosen; --measure offers only those named
(repeatable or a comma list; "attention" alone: none). The rollout is always there, as the
Attention control's rollout mode. value-zeroing is refused above 128 tokens.
The model computes one request at a time, and a measure of a long text takes seconds (ALTI of
461 tokens, 2,000 characters: 4.7-6.5 s on a 2-core AMD EPYC). The page drops what it no longer
needs (another measure's maps once a new one is chosen, a text's once another is analysed), and
the server skips such a request if it has not begun (--debug shows each one dropped).
Answers of 500 bytes or more are gzip-compressed for clients that accept it (browsers do). An
address over 16 KiB gets HTTP 414, headers over 32 KiB in all HTTP 431; a request head over
64 KiB may get uvicorn's plain HTTP 400 instead, its connection closed.
Needs FastAPI and uvicorn (pip install 'bertscope[serve]'). Stop it with Ctrl-C or SIGTERM: it
finishes the requests open (and says how many), waiting at most --stop-timeout seconds (default
10); a second Ctrl-C or SIGTERM stops at once. A request cut short before its answer began gets
HTTP 503. The exit status is 130 after Ctrl-C, 143 after SIGTERM.

examples:
  bertscope serve                       # then open http://127.0.0.1:8000/
  bertscope serve --port 8080 --max-chars 5000
  bertscope serve --model ./my-bert-folder --host 0.0.0.0   # reachable from other machines
  bertscope serve --host 0.0.0.0 --allow-host bert.example.org
  bertscope serve --measure alti,norm    # only these two beside the attention weights
"""


def register(sub) -> None:
    p = sub.add_parser("serve", help="the attention explorer as a local web app", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-chars", type=int, default=2000, metavar="N",
                   help="longest text accepted, in characters (default 2000); longer gets HTTP 413")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also answer requests whose Host header is NAME (repeatable)")
    p.add_argument("--measure", action="append", default=None, metavar="M[,M...]",
                   help="measures offered beside the attention (default: all of norm, norm-residual, "
                        "value-zeroing, alti)")
    p.add_argument("--stop-timeout", type=float, default=10.0, metavar="S",
                   help="on Ctrl-C, wait at most S seconds for the requests open, then stop them (default 10)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os
    import signal
    import sys
    import warnings

    from ..core.tokenizer import TruncationWarning
    from ..errors import InputError
    from ..see.server import StoppedAtOnce, bind, is_all_interfaces, require_serve_extra
    from ..see.server import run as serve

    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be 0..65535, got {args.port}")
    if args.max_chars < 1:
        raise InputError("--max-chars must be at least 1")
    if not 0 <= args.stop_timeout < float("inf"):  # NaN too
        raise InputError(f"--stop-timeout must be a number of seconds, 0 or more, got {args.stop_timeout:g}")
    from ..explain import MAP_METHODS, map_measures, measure_info

    args.host = _check_host(args.host)
    for name in args.allow_host:
        if not name.strip() or "/" in name or any(c.isspace() for c in name):
            raise InputError(f"--allow-host takes a host name such as bert.example.org, got {name!r}")
    names = page_measures(args.measure, default=MAP_METHODS)
    require_serve_extra()  # before anything is bound, loaded or printed
    if is_all_interfaces(args.host):
        print(f"bertscope: warning: --host {args.host or '(empty)'} listens on every network interface: anyone "
              "who can reach this machine can use this server", file=sys.stderr, flush=True)
    sock = bind(args.host, args.port)  # before the model loads: a port in use is a one-line error
    try:
        bert = load_model(args)
        port = sock.getsockname()[1]  # the real one when --port 0 let the system choose
        print(f"bertscope: serving {bert.name} on {where(args.host, port)} (Ctrl-C stops)",
              file=sys.stderr, flush=True)
        # the page says when a text was cut to fit the model; the terminal need not, per request
        warnings.filterwarnings("ignore", category=TruncationWarning)
        serve(bert, host=args.host, max_chars=args.max_chars, sock=sock,
              allowed_hosts=tuple(args.allow_host),
              measures=(lambda b, text, pair, wanted: map_measures(b, text, wanted, pair=pair)) if names else None,
              measure_info=[measure_info(m) for m in names], stop_timeout=args.stop_timeout)
    except StoppedAtOnce as e:  # a second Ctrl-C: not to wait at exit for the computations it cut short
        term = e.signal == signal.SIGTERM
        print(f"bertscope: {'terminated' if term else 'interrupted'}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(143 if term else 130)
    finally:
        sock.close()
    return 0


def where(host: str, port: int) -> str:
    """The address the banner gives: a URL a browser opens. 0.0.0.0 and :: are where the server
    listens, not addresses every browser opens: it names the loopback one, and the others."""
    from ..see.server import is_all_interfaces

    shown = ("::1" if ":" in host else "127.0.0.1") if is_all_interfaces(host) else host
    url = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}/"
    return url + (" and this machine's other addresses" if shown != host else "")


def _check_host(host: str) -> str:
    """--host as bind() takes it: spaces and IPv6 brackets off ("[::1]", as the banner prints it,
    is ::1); empty or a URL refused, in one line."""
    from ..errors import InputError

    h = host.strip()
    if "://" in h or "/" in h:
        raise InputError(f"--host takes an address or host name (127.0.0.1, ::1, 0.0.0.0), not a URL: {host!r}")
    import ipaddress
    import re

    bracketed = re.fullmatch(r"\[([^\]]*)\]:(\d+)", h)  # [::1]:8000
    name, _, port = h.rpartition(":")
    if bracketed or (port.isdigit() and name and ":" not in name):  # 127.0.0.1:8000, localhost:8000
        try:  # an IPv6 address whose last group is all digits (::1, fe80::1) is an address
            ipaddress.IPv6Address(h)
        except ValueError:
            given = bracketed.group(1) if bracketed else name
            raise InputError(f"--host takes no port: use --host {given} --port "
                             f"{bracketed.group(2) if bracketed else port}") from None
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if not h:
        raise InputError("--host is empty; give an address: 127.0.0.1 (this machine only, the default) or "
                         "0.0.0.0 (every interface)")
    return h
