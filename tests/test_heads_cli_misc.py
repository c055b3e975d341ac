"""The analysis modules do not import matplotlib unless asked to plot; every command has help with examples."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bertscope.cli.main import main


def test_matplotlib_not_imported_by_analysis_modules():
    code = ("import sys, bertscope, bertscope.trace, bertscope.headstats, bertscope.headmaps, bertscope.coref, "
            "bertscope.wsc, bertscope.ablate, bertscope.experiments, bertscope.experiments_report, "
            "bertscope.cli.main; from bertscope.cli.main import build_parser; build_parser(); "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("cmd", ["trace", "heads", "coref", "ablate", "experiments"])
def test_help_has_examples(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"bertscope {cmd}" in out
