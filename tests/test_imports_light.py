"""`import bertscope` must not pull in plotting or web-serving libraries."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_bertscope_stays_light():
    code = ("import sys, bertscope, bertscope.see.report, bertscope.bench, bertscope.fast.embedjob, bertscope.scale; from bertscope.cli.app import build_parser; "
            "build_parser(); "
            "heavy = [m for m in ('matplotlib', 'fastapi', 'starlette', 'uvicorn', 'playwright', 'ray', 'pyarrow') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})


def test_ctrl_c_while_torch_imports_waits_for_it_then_is_one_line():
    """A Ctrl-C in a command's first second, while torch imports, is the command line's one line
    and status 130, and it does not cut torch's import short: a half-imported torch aborts the
    process at the next import of it (embed's resume check imports it), and numpy's import
    from torch's C code can swallow the interrupt. The SIGINT is sent where torch's import
    begins, so the test does not depend on when a signal lands."""
    code = ("import os, signal, sys\n"
            "cut = []\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n"
            "            sys.meta_path.remove(self)\n"
            "            try:\n"
            "                os.kill(os.getpid(), signal.SIGINT)\n"
            "                signal.getsignal(signal.SIGINT)\n"  # a few bytecodes: the handler runs here
            "            except KeyboardInterrupt:\n"
            "                cut.append(name)\n"
            "                raise\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "from bertscope.cli import main\n"  # the console script's own import: torch stays out
            "rc = main(['params', '--preset', 'bert-base'])\n"
            "import torch\n"
            "print('cut', cut, 'whole', hasattr(torch, 'nn') and torch.ones(2).sum().item() == 2.0)\n"
            "sys.exit(rc)\n")
    r = _python(code)
    assert (r.returncode, r.stderr) == (130, "bertscope: interrupted\n"), r.stderr
    assert r.stdout == "cut [] whole True\n"  # the command never ran; torch was imported whole


def test_public_names_import_on_first_use():
    """`import bertscope` waits for nothing heavy; every name in __all__ still resolves, to the
    object its defining module holds; `bertscope.explain` stays the function after the
    subpackage of the same name is imported; subpackages are reachable as attributes."""
    code = ("import sys, importlib, bertscope\n"
            "assert 'torch' not in sys.modules, 'import bertscope imported torch'\n"
            "import bertscope.explain.measures, bertscope.cli.app\n"
            "from bertscope.cli.app import build_parser; build_parser()\n"
            "from bertscope.explain import explain\n"
            "assert bertscope.explain is explain, bertscope.explain\n"
            "for name in bertscope.__all__:\n"
            "    value = getattr(bertscope, name)\n"
            "    home = bertscope._HOME.get(name)\n"
            "    if home: assert value is getattr(importlib.import_module(home, 'bertscope'), name), name\n"
            "assert bertscope.core.model.BertModel is bertscope.BertModel\n"
            "try:\n"
            "    bertscope.no_such_name\n"
            "except AttributeError as e:\n"
            "    assert 'no_such_name' in str(e)\n"
            "else:\n"
            "    raise SystemExit('no AttributeError')\n"
            "print(len(bertscope.__all__))\n")
    r = _python(code)
    assert r.returncode == 0, r.stdout + r.stderr
    assert int(r.stdout) > 40  # the names were all there to check


def test_type_checkers_see_the_same_names():
    """The TYPE_CHECKING imports (what editors and type checkers read) name exactly the lazy
    table's names, each from its home module."""
    import ast
    tree = ast.parse((ROOT / "src/bertscope/__init__.py").read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {alias.name: "." + (imp.module or "") for imp in guarded.body for alias in imp.names}
    import bertscope
    assert seen == bertscope._HOME
    assert sorted(bertscope.__all__) == sorted([*bertscope._HOME, "__version__"])


def test_patching_explain_is_undone_like_any_name():
    """unittest.mock.patch undoes by deleting what it set; the function comes back."""
    from unittest import mock

    import bertscope
    from bertscope.explain import explain

    with mock.patch("bertscope.explain", "a stand-in"):
        assert bertscope.explain == "a stand-in"
    assert bertscope.explain is explain
    with mock.patch.object(bertscope, "load", "a stand-in"):
        assert bertscope.load == "a stand-in"
    assert bertscope.load is bertscope.bert.load


def test_a_broken_torch_is_one_line_not_a_traceback():
    """torch that fails to import (a broken install) gave Python's traceback."""
    code = ("import sys\n"
            "class Broken:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n"
            "            raise ImportError('libtorch_cpu.so: cannot open shared object file')\n"
            "sys.meta_path.insert(0, Broken())\n"
            "from bertscope.cli import main\n"
            "sys.exit(main(['params', '--preset', 'bert-base']))\n")
    r = _python(code)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("bertscope: error: cannot import torch (ImportError: libtorch_cpu.so: cannot open shared "
                        "object file); reinstall it as the README says (pip install torch==2.13.0)\n")


def test_a_second_ctrl_c_while_torch_imports_stops_at_once():
    """The first Ctrl-C is held until torch is imported; a second (the import hangs on a slow
    disk) stops there, in one line, without waiting for the import."""
    code = ("import os, signal, sys\n"
            "class Hang:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n"
            "            os.kill(os.getpid(), signal.SIGINT)\n"
            "            for _ in range(3): pass\n"  # a loop's jump runs the handler: two signals, not one
            "            os.kill(os.getpid(), signal.SIGINT)\n"
            "            while True:\n"  # an import that never ends: only the second Ctrl-C leaves it
            "                signal.getsignal(signal.SIGINT)\n"
            "sys.meta_path.insert(0, Hang())\n"
            "from bertscope.cli import main\n"
            "sys.exit(main(['params', '--preset', 'bert-base']))\n")
    r = _python(code)
    assert (r.returncode, r.stdout, r.stderr) == (130, "", "bertscope: interrupted\n"), r.stderr


def test_the_cli_module_is_not_hidden_by_its_function():
    """``cli/__init__`` bound ``main``, the function, over the module of that name: ``import
    bertscope.cli.main as m`` gave the function, and ``m.build_parser`` failed. The module is
    ``cli.app``; ``bertscope.cli.main`` is the function the console script names, so a script
    installed before (``from bertscope.cli import main``) still runs."""
    import importlib
    import importlib.metadata as md
    import importlib.util
    import types

    import bertscope.cli
    import bertscope.cli.app as app

    assert isinstance(app, types.ModuleType) and callable(app.build_parser)
    assert bertscope.cli.main is app.main and importlib.util.find_spec("bertscope.cli.main") is None
    (script,) = [e for e in md.entry_points(group="console_scripts") if e.name == "bertscope"]
    module, _, name = script.value.partition(":")
    assert getattr(importlib.import_module(module), name) is app.main
