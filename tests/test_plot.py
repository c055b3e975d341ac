"""bertscope plot: heatmaps as PNG/SVG, and the figure's numbers are the model's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertscope.errors import InputError
from bertscope.see.figures import grid_figure, head_figure, units
from bertscope.see.report import analyze

from conftest import IT_ANIMAL

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "bertscope", "plot", *args], capture_output=True,
                          text=True, env=env, timeout=180)


def test_plot_png_and_svg(tmp_path):
    png, svg = tmp_path / "head.png", tmp_path / "grid.svg"
    r = _cli(IT_ANIMAL, "--layer", "3", "--head", "1", "--out", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    r = _cli(IT_ANIMAL, "--grid", "--out", str(svg))
    assert r.returncode == 0, r.stderr
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and "layer 5" in text


def test_plot_counts_negative_layers_and_heads_from_the_end_as_trace_does(tmp_path):
    """plot refused --layer -1, which trace and explain take as the last layer."""
    r = _cli(IT_ANIMAL, "--layer", "-1", "--head", "-1", "--out", str(tmp_path / "last.svg"))
    assert r.returncode == 0, r.stderr
    assert "layer 5, head 11" in (tmp_path / "last.svg").read_text()  # named from 0


def test_plot_user_errors(tmp_path):
    r = _cli(IT_ANIMAL, "--layer", "9", "--out", str(tmp_path / "x.png"))
    assert r.returncode == 2 and "--layer must be a whole number from 0 to 5 (or -6 to -1" in r.stderr
    r = _cli(IT_ANIMAL, "--head", "-13", "--out", str(tmp_path / "x.png"))
    assert r.returncode == 2 and "--head must be a whole number from 0 to 11 (or -12 to -1" in r.stderr
    r = _cli(IT_ANIMAL, "--out", str(tmp_path / "x.gif"))
    assert r.returncode == 2 and ".png" in r.stderr
    assert not list(tmp_path.iterdir())


def test_figure_shows_the_models_attention(bert, hf_model):
    import torch

    [rt] = analyze(bert, [IT_ANIMAL])
    fig = head_figure(rt, 3, 1)
    ax = fig.axes[0]
    shown = ax.images[0].get_array()
    labels, att = units(rt, words=True)
    b = bert.encode([IT_ANIMAL])
    with torch.inference_mode():
        ref = hf_model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_attentions=True).attentions[3][0, 1]
    # word level, computed here independently: sum over a word's sub-tokens as keys, mean as queries
    tw = np.array(rt.token_words)
    W = tw.max() + 1
    assign = np.zeros((len(tw), W))
    assign[np.arange(len(tw)), tw] = 1
    ref_w = (assign / assign.sum(0)).T @ ref.numpy() @ assign
    np.testing.assert_allclose(np.asarray(shown), ref_w, atol=1e-5)
    assert [t.get_text() for t in ax.get_xticklabels()] == labels
    assert len(grid_figure(rt).axes) == 6 * 12 + 1  # and one colour bar


def test_grid_has_one_scale_and_a_colour_bar_unless_per_panel(bert):
    [rt] = analyze(bert, [IT_ANIMAL])
    _, att = units(rt, words=True)
    fig = grid_figure(rt)
    limits = {ax.images[0].get_clim() for ax in fig.axes if ax.images}
    assert limits == {(0.0, float(att.max()))}  # one scale: 0 .. the largest weight of all panels
    assert any("one scale" in ax.get_ylabel() for ax in fig.axes)  # the colour bar says so
    fig = grid_figure(rt, shared=False)
    limits = [ax.images[0].get_clim()[1] for ax in fig.axes if ax.images]
    assert len(fig.axes) == 6 * 12 and len(set(limits)) > 30  # each its own, and no shared bar
    assert "not comparable" in fig._suptitle.get_text()
    fig = grid_figure(rt, vmax=0.5)
    assert {ax.images[0].get_clim() for ax in fig.axes if ax.images} == {(0.0, 0.5)}


def test_vmax_is_finite_and_not_given_with_per_panel_scales(bert):
    from bertscope.errors import InputError

    rt = analyze(bert, [IT_ANIMAL])[0]
    for bad in (float("inf"), 0.0, float("nan"), "1"):
        with pytest.raises(InputError, match="must be a finite number above 0"):
            head_figure(rt, 3, 1, vmax=bad)
    with pytest.raises(InputError, match="give one or the other"):
        grid_figure(rt, shared=False, vmax=0.5)
    import torch  # numbers of numpy and torch are numbers: vmax=M.max() of a float32 array
    for ok in (np.float32(0.5), np.int64(1), torch.tensor(0.5), 1):
        assert head_figure(rt, 3, 1, vmax=ok).axes[0].images[0].get_clim() == (0.0, float(ok))


def test_vmax_and_span(bert):
    [rt] = analyze(bert, [IT_ANIMAL])
    fig = head_figure(rt, 3, 1, vmax=1.0)
    assert fig.axes[0].images[0].get_clim() == (0.0, 1.0)  # two figures with --vmax 1 compare
    labels, att = units(rt, words=True)
    span = (7, 13)  # sub-tokens 7..12: "the street because it was too" (one token per word here)
    fig = head_figure(rt, 3, 1, span=span)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == labels[7:13] == rt.tokens[7:13]
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), att[3, 1, 7:13, 7:13])  # not renormalised
    assert "tokens 7–12" in ax.get_title()


def test_plot_cli_span_vmax_and_their_errors(tmp_path, capsys):
    from bertscope.cli.app import main

    out = tmp_path / "w.png"
    assert main(["plot", IT_ANIMAL, "--layer", "3", "--head", "1", "--span", "7:13", "--vmax", "1", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    for args, why in ((["--vmax", "0"], "--vmax"), (["--vmax", "nan"], "--vmax"), (["--per-panel"], "--grid"),
                      (["--vmax", "inf"], "--vmax must be a finite number above 0, got inf"),
                      (["--grid", "--per-panel", "--vmax", "0.5"], "give one or the other"),  # --vmax was dropped
                      (["--grid", "--layer", "2"], "leave out --layer and --head"),
                      (["--span", "50:60"], "selects no token (the text has 15 tokens, 0..14)"),
                      (["--span", "5:2"], "error: --span 5:2 selects no token (END must be after START)"),
                      (["--span", "x"], "START:END")):
        assert main(["plot", IT_ANIMAL, *args, "--out", str(tmp_path / "bad.png")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err, (args, err)
    assert not (tmp_path / "bad.png").exists()


def test_plot_bad_output_paths(tmp_path, capsys):
    from bertscope.cli.app import main

    folder = tmp_path / "d.png"
    folder.mkdir()
    for out, why in ((folder, "is a folder"), (tmp_path / "missing" / "x.png", "does not exist"),
                     (f"{tmp_path}/new.png/", "names a folder (it ends in /); give a file name")):  # it wrote new.png
        assert main(["plot", "T", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.png"]


def test_plot_measure_cli_and_its_errors(tmp_path, capsys):
    from bertscope.cli.app import main

    out = tmp_path / "norm.png"
    assert main(["plot", IT_ANIMAL, "--measure", "norm", "--layer", "3", "--head", "1", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    one_of = "--measure takes one of attention, norm, norm-residual, value-zeroing, alti, rollout; got"
    for args, why in ((["--measure", "nope"], f"{one_of} 'nope'"),
                      (["--measure", "alti", "--head", "1"], "one map per layer"),
                      (["--measure", "norm,alti"], f"{one_of} 'norm,alti'"),
                      (["--measure", "all"], f"{one_of} 'all'")):  # the list offers no "all" here
        assert main(["plot", IT_ANIMAL, *args, "--out", str(tmp_path / "bad.png")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err, (args, err)
    assert not (tmp_path / "bad.png").exists()


def test_measure_figures_show_explains_maps(bert):
    from bertscope import explain
    from bertscope.explain import map_measures
    from bertscope.see.report import with_measures

    [rt] = analyze(bert, [IT_ANIMAL], qk=False)
    rt = with_measures(rt, map_measures(bert, IT_ANIMAL, ["norm", "alti"]))
    alti = explain(bert, IT_ANIMAL, "alti").word_maps()  # (N, W, W), explain's own word rule
    norm = explain(bert, IT_ANIMAL, "norm").word_maps()  # (N, H, W, W)
    ax = head_figure(rt, 4, None, measure="alti").axes[0]
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), alti[4], atol=1e-6)
    assert ax.get_title().startswith("alti, layer 4")
    fig = head_figure(rt, 3, 1, measure="norm")
    ax = fig.axes[0]
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), norm[3, 1], atol=1e-5)
    assert fig.axes[1].get_ylabel() == "norm"  # the colour bar names what it measures
    assert head_figure(rt, 3, 1).axes[1].get_ylabel() == "attention weight"
    last = head_figure(rt, -1, -1).axes[0]  # counted from the end, as everywhere else in the API
    np.testing.assert_array_equal(np.asarray(last.images[0].get_array()),
                                  np.asarray(head_figure(rt, 5, 11).axes[0].images[0].get_array()))
    assert last.get_title().startswith("layer 5, head 11")
    with pytest.raises(InputError, match=r"^layer \(--layer\) must be a whole number from 0 to 5"):
        head_figure(rt, 1.5, 0)  # was an IndexError from numpy
    fig = grid_figure(rt, measure="alti")
    panels = [a for a in fig.axes if a.images]
    assert len(panels) == rt.attentions.shape[0]  # a panel per layer, no heads
    np.testing.assert_allclose(np.asarray(panels[2].images[0].get_array()), alti[2], atol=1e-6)


def test_missing_glyphs_are_one_warning(bert):
    """A CJK text on a machine without a CJK font gave one matplotlib warning per character (75
    lines for one plot); now one warning names them (none where a font has them)."""
    import warnings

    from bertscope.see.figures import figure_bytes

    text = "".join(chr(0x4E00 + 7 * i) for i in range(20))
    [rt] = analyze(bert, [text])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        png = figure_bytes(head_figure(rt, 0, 0))
    glyphs = [str(w.message) for w in caught if "glyph" in str(w.message).lower()]
    assert len(glyphs) <= 1, glyphs
    if glyphs:
        assert glyphs[0].startswith("20 character(s) of the text have no glyph"), glyphs
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_old_matplotlib_is_named_before_any_work(monkeypatch, capsys, tmp_path):
    """matplotlib 3.6 with NumPy 2 passed the check, ran the model, then failed in a traceback and
    the line "plotting needs matplotlib" (which was installed)."""
    from bertscope.cli.app import main
    from bertscope.see import figures

    assert figures._installed_version("matplotlib") >= figures.MIN_MATPLOTLIB  # the real one passes
    monkeypatch.setattr(figures, "_installed_version", lambda name: (3, 6))
    monkeypatch.setattr("bertscope.cli.plot.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["plot", IT_ANIMAL, "--out", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err == ("bertscope: error: plotting needs matplotlib 3.7 or newer, and 3.6 is "
                                       "installed: pip install --upgrade 'bertscope[plot]'\n")


def test_heatmap_labels_read_on_their_cells(monkeypatch, tmp_path):
    """The class map is drawn with Set3, whose twelve colours are all pale: its labels were white
    on half the cells. Each label now takes black or white by its cell's colour (WCAG 2's contrast
    ratio): black on every Set3 colour, white on viridis' dark end, black on its yellow end."""
    import matplotlib
    from matplotlib.axes import Axes

    import bertscope.see.figures as figures
    from bertscope.understand.headstats import CLASSES

    set3 = matplotlib.colormaps["Set3"]
    assert [figures._ink(set3(i)) for i in range(set3.N)] == ["black"] * 12
    viridis = matplotlib.colormaps["viridis"]
    assert figures._ink(viridis(0.0)) == "white" and figures._ink(viridis(1.0)) == "black"
    assert figures._ink((0.0, 0.0, 0.0, 1.0)) == "white" and figures._ink((1.0, 1.0, 1.0, 1.0)) == "black"

    drawn = []
    real = Axes.text

    def spy(self, x, y, s, *a, **kw):
        drawn.append((s, kw.get("color")))
        return real(self, x, y, s, *a, **kw)

    monkeypatch.setattr(Axes, "text", spy)
    figures.save_class_map(tmp_path / "classes.png", [list(CLASSES), list(reversed(CLASSES))], CLASSES, "classes")
    assert [c for _, c in drawn] == ["black"] * (2 * len(CLASSES))
    assert figures._ink((0.0, 0.0, 0.0, 0.0)) == "black"  # a NaN cell: see-through, over white
    drawn.clear()
    figures.heatmap_png(torch.tensor([[0.0, 1.0]]), "values", cmap="viridis")
    assert drawn == [("0.00", "white"), ("1.00", "black")]
