"""End to end in headless Chromium: the HTML report from disk, and `bertscope serve`.

The numbers the page shows are compared with HF transformers' attentions, computed here (word
level and the aggregates are computed here too, with numpy, independently of the page's code).
Tolerance 1e-3: the report stores weights to within 1/2048 and shows 4 decimals.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from bertscope.see.report import build_report

from conftest import IT_ANIMAL
from viewkit import artifact, chromium, served

WIDE = "The animal didn't cross the street because it was too wide"
TOL = 1e-3


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def reference(bert, hf_model, text: str) -> dict:
    """HF attentions (N, H, T, T) and, computed here, word level, mean over heads and rollout."""
    b = bert.encode([text])
    with torch.inference_mode():
        out = hf_model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                       token_type_ids=b.token_type_ids, output_attentions=True)
    att = torch.stack([a[0] for a in out.attentions]).double().numpy()  # (N, H, T, T)
    from bertscope.core.words import group_words

    tw = np.array(group_words(b, text).token_words)
    assign = np.zeros((len(tw), tw.max() + 1))
    assign[np.arange(len(tw)), tw] = 1.0
    to_words = lambda m: (assign / assign.sum(0)).T @ m @ assign  # noqa: E731
    T = att.shape[-1]
    rolled, rollout = np.eye(T), []
    for layer in range(att.shape[0]):
        rolled = (0.5 * att[layer].mean(0) + 0.5 * np.eye(T)) @ rolled
        rollout.append(rolled)
    return {"tokens": att, "words": to_words(att), "mean_words": to_words(att.mean(1)),
            "rollout_words": to_words(np.stack(rollout))}


def shown_values(page, panel: int = 0) -> list[dict]:
    return page.eval_on_selector_all(
        f"#bs-head-view .bs-panel[data-panel='{panel}'] td.bs-val",
        "els => els.map(e => ({from: +e.dataset.from, to: +e.dataset.to, head: e.dataset.head, "
        "value: +e.dataset.value, text: +e.textContent.trim().split(/\\s/)[0]}))")


def check_values(values: list[dict], expected_row: np.ndarray, head: str) -> None:
    mine = [v for v in values if v["head"] == head]
    assert len(mine) == len(expected_row), (len(mine), len(expected_row))
    for v in mine:
        assert abs(v["value"] - expected_row[v["to"]]) <= TOL, v
        assert abs(v["text"] - expected_row[v["to"]]) <= TOL, v


def lines_image(page, panel: int = 0) -> str:
    return page.eval_on_selector(f"#bs-head-view .bs-panel[data-panel='{panel}'] canvas.bs-lines", "c => c.toDataURL()")


def settle(page) -> None:
    page.wait_for_selector("html[data-rendered='1']", state="attached", timeout=30_000)


def click_token(page, index: int, side: str = "left", panel: int = 0) -> None:
    page.click(f"#bs-head-view .bs-panel[data-panel='{panel}'] .bs-tok.bs-{side}[data-i='{index}']")


def explore(page, ref: dict, words: list[str]) -> None:
    """The interactions both tests share: click "it", switch layer and head, aggregates."""
    it, animal = words.index("it"), words.index("animal")
    before = lines_image(page)
    click_token(page, it)
    check_values(shown_values(page), ref["words"][0, 0, it], "0")
    focused = lines_image(page)
    assert focused != before  # focusing a token redraws only its lines

    page.select_option("#bs-layer", "3")
    settle(page)
    page.click(".bs-head[data-head='1']")
    settle(page)
    assert page.get_attribute("#bs-head-view .bs-panel[data-panel='0']", "data-layer") == "3"
    assert page.get_attribute("#bs-head-view .bs-panel[data-panel='0']", "data-heads") == "1"
    after = lines_image(page)
    assert after != focused  # a different layer and head draws differently
    values = shown_values(page)
    check_values(values, ref["words"][3, 1, it], "1")
    top = max((v for v in values if v["head"] == "1"), key=lambda v: v["value"])
    assert top["to"] == animal  # S12: in this head "it" looks at "animal"

    page.click(".bs-head[data-head='11']", modifiers=["Shift"])  # add a second head
    settle(page)
    values = shown_values(page)
    check_values(values, ref["words"][3, 1, it], "1")
    check_values(values, ref["words"][3, 11, it], "11")

    page.select_option("#bs-mode", "mean")
    settle(page)
    check_values(shown_values(page), ref["mean_words"][3, it], "mean")
    page.select_option("#bs-mode", "rollout")
    settle(page)
    check_values(shown_values(page), ref["rollout_words"][3, it], "rollout")

    page.select_option("#bs-mode", "heads")
    page.click(".bs-head[data-head='1']")
    settle(page)
    page.select_option("#bs-level", "token")
    settle(page)
    click_token(page, it)  # at sub-token level data-i is a token index: compare with the token matrix
    values = shown_values(page)
    frm = values[0]["from"]
    check_values(values, ref["tokens"][3, 1, frm], "1")

    page.check("#bs-hide-special")
    settle(page)
    labels = page.eval_on_selector_all("#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-left", "els => els.map(e => e.textContent)")
    assert "[CLS]" not in labels and "[SEP]" not in labels and "it" in labels
    page.uncheck("#bs-hide-special")
    page.select_option("#bs-level", "word")
    settle(page)

    # matrix view: the exact value under the cursor
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    frm, to, val = matrix_readout(page, "0", 0.7, 0.7)
    assert abs(val - ref["words"][3, 1, int(frm), int(to)]) <= TOL

    # model view: every layer x head; clicking one opens it in the head view
    page.click(".bs-tab[data-view='model']")
    settle(page)
    assert page.locator("canvas.bs-thumb").count() >= 6 * 14
    page.click("canvas.bs-thumb[data-layer='5'][data-head='11']")
    settle(page)
    assert page.get_attribute("#bs-head-view .bs-panel[data-panel='0']", "data-layer") == "5"
    assert page.get_attribute("#bs-head-view .bs-panel[data-panel='0']", "data-heads") == "11"
    click_token(page, it)
    check_values(shown_values(page), ref["words"][5, 11, it], "11")


def matrix_readout(page, panel: str, fx: float, fy: float) -> tuple[float, float, float]:
    """Hover the matrix view's heatmap of ``panel`` at a fraction of its size; read (from, to, value)."""
    canvas = page.locator(f"#bs-matrix-view .bs-panel[data-panel='{panel}'] canvas")
    box = canvas.bounding_box()
    canvas.hover(position={"x": box["width"] * fx, "y": box["height"] * fy})
    out = page.locator(f"#bs-matrix-view .bs-panel[data-panel='{panel}'] .bs-mreadout")
    frm, to, val = (float(out.get_attribute(k)) for k in ("data-from", "data-to", "data-value"))
    return frm, to, val


def test_report_from_disk(browser, bert, hf_model, tmp_path):
    rep = build_report(bert, IT_ANIMAL, WIDE)
    path = rep.save(tmp_path / "report.html")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    ref_a, ref_b = reference(bert, hf_model, IT_ANIMAL), reference(bert, hf_model, WIDE)
    explore(page, ref_a, rep.texts[0].words)
    page.screenshot(path=str(artifact("report-model-view.png")), full_page=True)

    # two texts: B beside A, and A - B in the matrix view
    page.click(".bs-tab[data-view='head']")
    settle(page)
    it = rep.texts[1].words.index("it")
    click_token(page, it, panel=1)
    check_values(shown_values(page, 1), ref_b["words"][5, 11, it], "11")
    page.screenshot(path=str(artifact("report-head-view.png")), full_page=True)
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    frm, to, val = matrix_readout(page, "diff", 0.75, 0.6)
    expected = ref_a["words"][5, 11, int(frm), int(to)] - ref_b["words"][5, 11, int(frm), int(to)]
    assert abs(val - expected) <= 2 * TOL
    page.screenshot(path=str(artifact("report-matrix-view.png")), full_page=True)
    assert not errors, errors
    assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), requests  # offline
    page.close()


def test_served_app(browser, bert, hf_model):
    with served() as base:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(base + "/")
        page.wait_for_selector("html[data-ready='form']", state="attached", timeout=30_000)
        page.fill("#bs-text", IT_ANIMAL)
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        words = page.eval_on_selector_all("#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-left", "els => els.map(e => e.textContent)")
        explore(page, reference(bert, hf_model, IT_ANIMAL), words)
        page.screenshot(path=str(artifact("serve-head-view.png")), full_page=True)

        page.fill("#bs-text", "x" * 2001)  # over the limit: the page shows the server's message
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='error']", state="attached", timeout=30_000)
        assert "limit" in page.inner_text("#bs-error")
        assert not errors, errors
        page.close()


def test_long_report_size_and_open_time(browser, bert, tmp_path):
    """512 tokens of a BERT-base-sized model (12 x 12 heads, random weights): < 30 MB, opens < 3 s."""
    import warnings

    from bertscope import Bert, BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig.preset("bert-base")
    big = Bert(config=cfg, model=BertModel(cfg).eval(), tokenizer=bert.tokenizer, name="bert-base (random)")
    text = " ".join(f"token{i} and the animal" for i in range(200))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = build_report(big, text)
    assert len(rep.texts[0].tokens) == 512
    path = rep.save(tmp_path / "long.html")
    size = path.stat().st_size
    assert size < 30e6, f"{size / 1e6:.1f} MB"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri(), wait_until="commit")
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    # Measured inside the page (from its navigation start), not around Playwright's calls:
    # the page's own work, without the driver's round trips on a busy machine.
    seconds = page.evaluate("performance.now()") / 1000
    assert not errors, errors
    assert seconds < 3.0, f"{seconds:.2f} s to open"
    # and it is usable: a token's numbers match the model's
    click_token(page, 100)
    vals = [v for v in shown_values(page) if v["head"] == "0"]
    row = rep.texts[0].attentions[0, 0]
    tw = np.array(rep.texts[0].token_words)
    frm_tokens = np.where(tw == 100)[0]
    expected = np.zeros(tw.max() + 1)
    np.add.at(expected, tw, row[frm_tokens].mean(0))
    assert max(abs(v["value"] - expected[v["to"]]) for v in vals) <= TOL
    page.close()
    with artifact("long-report.txt").open("w") as f:
        f.write(f"512 tokens, 12 layers x 12 heads: {size / 1e6:.1f} MB, ready in {seconds:.2f} s\n")


def test_notebook_frame_renders(browser, bert):
    """What Jupyter shows (_repr_html_): the explorer inside an isolated iframe, working."""
    rep = build_report(bert, IT_ANIMAL)
    page = browser.new_page()
    page.set_content(f"<html><body><p>notebook cell</p>{rep._repr_html_()}</body></html>")
    frame = page.frame_locator("iframe")
    frame.locator("html[data-ready='1']").wait_for(state="attached", timeout=30_000)
    assert frame.locator("#bs-head-view .bs-tok.bs-left").count() == len(rep.texts[0].words)
    page.close()
