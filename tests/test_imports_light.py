"""`import bertscope` must not pull in plotting or web-serving libraries."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_bertscope_stays_light():
    code = ("import sys, bertscope, bertscope.see.report, bertscope.bench, bertscope.fast.embedjob, bertscope.scale; from bertscope.cli.main import build_parser; "
            "build_parser(); "
            "heavy = [m for m in ('matplotlib', 'fastapi', 'starlette', 'uvicorn', 'playwright', 'ray', 'pyarrow') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
