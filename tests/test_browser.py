"""End to end in headless Chromium: the HTML report from disk, and `bertscope serve`.

The numbers the page shows are compared with HF transformers' attentions, computed here (word
level and the aggregates are computed here too, with numpy, independently of the page's code).
Tolerance 1e-3: the report stores weights to within 1/2048; the text it shows has 3 decimals
(from a file) or 4 (from the server), so the text gets half a thousandth more.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from bertscope.see.report import build_report

from conftest import IT_ANIMAL
from viewkit import artifact, chromium, served

WIDE = "The animal didn't cross the street because it was too wide"
TOL = 1e-3
TEXT_TOL = TOL + 5e-4  # the shown text is rounded to 3 decimals


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
        assert abs(v["text"] - expected_row[v["to"]]) <= TEXT_TOL, v


def lines_image(page, panel: int = 0) -> str:
    return page.eval_on_selector(f"#bs-head-view .bs-panel[data-panel='{panel}'] canvas.bs-lines", "c => c.toDataURL()")


def open_report(browser, rep, path, width: int = 1400, height: int = 1000):
    """A page on the saved report, ready, and the list its page errors go to."""
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(rep.save(path).as_uri())
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    return page, errors


def settle(page) -> None:
    page.wait_for_selector("html[data-rendered='1']", state="attached", timeout=30_000)


def show_head(page, layer: int, head: int, view: str | None = None) -> None:
    """Choose a layer and one head (in the head view), then ``view``'s tab if given; each step
    waits for the page to draw."""
    page.select_option("#bs-layer", str(layer))
    settle(page)
    page.click(f".bs-head[data-head='{head}']")
    settle(page)
    if view is not None:
        page.click(f".bs-tab[data-view='{view}']")
        settle(page)


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

    show_head(page, 3, 1)
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
    assert "the mean over the layer's heads" in page.inner_text("#bs-hint")  # it said "one colour per head"
    page.select_option("#bs-mode", "rollout")
    settle(page)
    check_values(shown_values(page), ref["rollout_words"][3, it], "rollout")
    assert "rolled out through the layers" in page.inner_text("#bs-hint")

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
    # a click focuses the heatmap and keeps the cell under the pointer (it jumped to [CLS] -> [CLS])
    grid = page.locator("#bs-matrix-view .bs-panel[data-panel='0'] canvas.bs-grid")
    box = grid.bounding_box()
    grid.click(position={"x": box["width"] * 0.7, "y": box["height"] * 0.7})
    out = page.locator("#bs-matrix-view .bs-panel[data-panel='0'] .bs-mreadout")
    assert [float(out.get_attribute(k)) for k in ("data-from", "data-to", "data-value")] == [frm, to, val]
    # the keyboard reads every cell too, from there: Home, then the arrows, then End
    assert out.get_attribute("aria-live") == "polite"
    row = int(frm)
    for key in ("Home", "ArrowDown", "ArrowRight", "ArrowRight", "ArrowUp", "ArrowDown"):
        page.keyboard.press(key)
    keyed = [float(out.get_attribute(k)) for k in ("data-from", "data-to", "data-value")]
    assert keyed[:2] == [row + 1, 2] and abs(keyed[2] - ref["words"][3, 1, row + 1, 2]) <= TOL
    page.keyboard.press("End")  # the row's last column
    last = ref["words"].shape[-1] - 1
    assert float(out.get_attribute("data-to")) == last
    assert abs(float(out.get_attribute("data-value")) - ref["words"][3, 1, row + 1, last]) <= TOL

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
    canvas = page.locator(f"#bs-matrix-view .bs-panel[data-panel='{panel}'] canvas.bs-grid")
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
    it = rep.texts[1].words.index("it")  # "it" pinned in A is focused in B too (linked focus)
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


def open_served(browser, base: str, query: str = ""):
    """A page on a running `bertscope serve`, showing the text it opens on, and the list its
    page errors go to."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(base + "/" + query)
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
    return page, errors


def shown_words(page, panel: int = 0) -> list[str]:
    return page.eval_on_selector_all(f"#bs-head-view .bs-panel[data-panel='{panel}'] .bs-tok.bs-left",
                                     "els => els.map(e => e.textContent)")


def test_served_page_opens_on_its_sample_and_its_address_holds_the_text(browser, bert, hf_model):
    """The page opened on a sample text and an empty view until "Show attention" was pressed;
    a text shown could not be linked to or survive a reload."""
    from urllib.parse import parse_qs, urlencode, urlsplit

    with served() as base:
        page, errors = open_served(browser, base)
        sample = page.input_value("#bs-text")
        assert sample == IT_ANIMAL
        words = shown_words(page)
        assert "animal" in words and "it" in words  # shown without a click
        it = words.index("it")
        click_token(page, it)
        settle(page)
        check_values(shown_values(page), reference(bert, hf_model, sample)["words"][0, 0, it], "0")
        assert parse_qs(urlsplit(page.url).query) == {"text": [sample]}

        page.fill("#bs-text", WIDE)  # a new text goes into the address, and a reload keeps it
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert parse_qs(urlsplit(page.url).query) == {"text": [WIDE]}
        page.reload()
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert page.input_value("#bs-text") == WIDE
        assert "wide" in shown_words(page)
        page.fill("#bs-text", "é漢 " * 600)  # 9,600 characters in the address: not kept there, and said
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert urlsplit(page.url).query == ""
        assert page.inner_text("#bs-form-status") == ("too long to keep in the page's address: a link or a "
                                                      "reload opens the sample")
        # Back and Forward go through the texts analysed (Back left the page)
        page.go_back()
        page.wait_for_function("() => document.getElementById('bs-text').value.includes('too wide')")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert "wide" in shown_words(page) and parse_qs(urlsplit(page.url).query) == {"text": [WIDE]}
        page.go_back()
        page.wait_for_function("() => document.getElementById('bs-text').value.includes('too tired')")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert "tired" in shown_words(page)
        page.go_forward()
        page.wait_for_function("() => document.getElementById('bs-text').value.includes('too wide')")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert "wide" in shown_words(page)
        assert not errors, errors
        page.close()

        page, errors = open_served(browser, base, "?text=+")  # a blank text in a link: the sample
        assert page.input_value("#bs-text") == IT_ANIMAL and "animal" in shown_words(page)
        page.close()

        # a link with a sentence pair opens on the pair: its segment B is marked
        query = "?" + urlencode({"text": "Where is the cat?", "pair": "The cat sleeps on the mat."})
        page, errors = open_served(browser, base, query)
        assert page.input_value("#bs-text-b") == "The cat sleeps on the mat."
        assert page.is_checked("#bs-pair")
        assert page.locator("#bs-head-view .bs-panel[data-panel='0'] .bs-segline").count() == 1
        assert shown_words(page) == ["[CLS]", "Where", "is", "the", "cat", "?", "[SEP]",
                                     "The", "cat", "sleeps", "on", "the", "mat", ".", "[SEP]"]
        # two texts to compare: two panels
        page.goto(base + "/?" + urlencode({"text": "A cat.", "text_b": "A dog."}))
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert shown_words(page, 1) == ["[CLS]", "A", "dog", ".", "[SEP]"]
        assert not page.is_checked("#bs-pair")
        assert not errors, errors
        page.close()


def test_served_app(browser, bert, hf_model):
    with served() as base:
        page, errors = open_served(browser, base)
        page.wait_for_function("() => document.getElementById('bs-model').textContent.includes('6 layers')",
                               timeout=30_000)  # the model is named in the header
        page.fill("#bs-text", IT_ANIMAL)
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        words = page.eval_on_selector_all("#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-left", "els => els.map(e => e.textContent)")
        explore(page, reference(bert, hf_model, IT_ANIMAL), words)
        page.screenshot(path=str(artifact("serve-head-view.png")), full_page=True)

        from bertscope import explain  # the Measure switch: the server computes the measure on demand

        before = lines_image(page)
        page.select_option("#bs-measure", "alti")
        settle(page)
        assert lines_image(page) != before
        assert page.get_attribute("#bs-measure option[value='alti']", "title").endswith("(Ferrando et al. 2022)")
        assert page.get_attribute("#bs-measure", "title").endswith("(Ferrando et al. 2022)")  # the one chosen
        check_values(shown_values(page), explain(bert, IT_ANIMAL, "alti").word_maps()[5, words.index("it")], "alti")
        page.select_option("#bs-measure", "attention")
        settle(page)

        page.fill("#bs-text", "x" * 2001)  # over the limit: the page says so, and sends nothing
        assert page.inner_text("#bs-text-count") == "2,001 / 2,000 characters"  # the counter knows the limit
        assert "bs-over" in page.get_attribute("#bs-text-count", "class")
        sent: list[str] = []
        page.on("request", lambda r: sent.append(r.url) if "/api/analyze" in r.url else None)
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='error']", state="attached", timeout=30_000)
        assert page.inner_text("#bs-error") == "The text has 2,001 characters; this server takes at most 2,000."
        assert not sent  # it used to send it, for a 413 and an error in the console
        # in view, beside the form: it used to sit below the old result, far under the fold
        assert page.eval_on_selector("#bs-error", "e => { const r = e.getBoundingClientRect(); "
                                     "return r.top >= 0 && r.bottom <= innerHeight; }")
        page.fill("#bs-text", "A short one.")  # the second text over the limit: named as such
        page.fill("#bs-text-b", "y" * 2001)
        page.click("#bs-submit")
        page.wait_for_function("() => document.getElementById('bs-error').textContent.startsWith('The second')",
                               timeout=30_000)
        assert page.inner_text("#bs-error") == "The second text has 2,001 characters; this server takes at most 2,000."
        page.fill("#bs-text-b", "")
        assert not sent

        page.fill("#bs-text", "A short text.")  # Enter submits, and the old error goes away
        page.press("#bs-text", "Enter")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert page.is_hidden("#bs-error")
        assert page.input_value("#bs-text") == "A short text."  # Enter did not add a line
        page.fill("#bs-text", "Another one.")
        page.press("#bs-text", "Control+Enter")
        page.wait_for_selector("#bs-head-view .bs-tok.bs-left:text-is('Another')", timeout=60_000)
        assert not errors, errors
    page.fill("#bs-text", "The server has stopped.")  # the browser's own words were only "Failed to fetch"
    page.click("#bs-submit")
    page.wait_for_selector("html[data-ready='error']", state="attached", timeout=30_000)
    assert "did not answer: is bertscope serve still running?" in page.inner_text("#bs-error")
    page.close()


def test_served_page_refuses_what_the_server_would_and_keeps_no_stale_picture(browser):
    """A failed render left the last picture on screen under the new error (the text line and
    the controls describing another text); value zeroing was offered for texts it refuses; a
    ticked pair box without a second text ran a single text; a right-to-left mark in a text
    reordered the note after it."""
    long_text = "the quick brown fox jumps over the lazy dog " * 20  # 182 tokens, under 2,000 characters
    with served() as base:
        page, errors = open_served(browser, base)
        page.fill("#bs-text", IT_ANIMAL)
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        page.select_option("#bs-measure", "value-zeroing")
        settle(page)
        vz = "#bs-measure option[value='value-zeroing']"
        assert not page.eval_on_selector(vz, "o => o.disabled")

        page.fill("#bs-text", long_text)  # too long for value zeroing: the page goes back to the weights
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert page.input_value("#bs-measure") == "attention" and page.is_hidden("#bs-error")
        assert page.eval_on_selector(vz, "o => o.disabled")
        assert "(texts up to 128 tokens; this one has 182)" in page.eval_on_selector(vz, "o => o.textContent")
        assert ("value-zeroing takes texts of up to 128 tokens and this one has 182: showing the attention "
                "weights instead.") in page.inner_text("#bs-texts")  # it changed in silence

        page.check("#bs-pair")  # a pair without its second text: said, and nothing is sent
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='error']", state="attached", timeout=30_000)
        assert page.inner_text("#bs-error").startswith("A sentence pair needs a second text")
        page.uncheck("#bs-pair")
        page.fill("#bs-text", "")  # the browser's own "fill out this field" replaces the old error
        page.click("#bs-submit")
        assert page.is_hidden("#bs-error")

        page.fill("#bs-text", "abc \u202e def")  # a right-to-left override stays inside its text
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert page.eval_on_selector_all("#bs-texts bdi", "els => els.map(e => e.textContent)") == ["abc \u202e def"]
        assert page.locator("#bs-head-view .bs-panel").count() == 1

        # a slow measure's request the page no longer wants (another measure is shown) is aborted,
        # so the server drops it if it has not begun (it kept its place in the server's queue);
        # the superseded render it belonged to leaves the newer picture alone: no error over it
        held = []
        hold = lambda data: '"alti"' in data and "A new text" not in data  # noqa: E731
        page.route("**/api/attention", lambda route: held.append(route) if hold(route.request.post_data or "")
                   else route.continue_())
        page.select_option("#bs-measure", "alti")  # waits on the held request
        page.wait_for_function("() => document.documentElement.dataset.rendered === '0'", timeout=30_000)
        assert len(held) == 1
        n = page.evaluate("() => window.bertscope.meta.texts[0].tokens.length")
        assert page.inner_text("#bs-progress") == f"computing alti for {n} tokens on the server…"  # not silence
        with page.expect_event("requestfailed", timeout=30_000) as failed:
            page.select_option("#bs-measure", "attention")  # drawn from what the page holds
        assert '"alti"' in failed.value.post_data and "ABORTED" in (failed.value.failure or ""), failed.value.failure
        settle(page)
        # the aborted fetch's rejection runs as a task after that: two frames later it has run
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        assert page.is_hidden("#bs-error") and page.get_attribute("html", "data-rendered") == "1"
        assert page.locator("#bs-head-view .bs-panel").count() == 1
        page.select_option("#bs-measure", "alti")  # asked again: fetched again, not the aborted one
        page.wait_for_function("() => document.documentElement.dataset.rendered === '0'", timeout=30_000)
        assert len(held) == 2
        with page.expect_event("requestfailed", timeout=30_000) as failed:  # a new text: the old one's wait ends
            page.fill("#bs-text", "A new text.")
            page.click("#bs-submit")
        assert '"alti"' in failed.value.post_data
        page.unroute("**/api/attention")
        page.wait_for_selector("#bs-head-view .bs-tok.bs-left:text-is('new')", timeout=60_000)
        assert page.is_hidden("#bs-error") and page.get_attribute("html", "data-rendered") == "1"
        # and when that new text's analysis fails: no "computing…" line left from the dropped
        # request, and the picture is not left dimmed under the error
        page.select_option("#bs-measure", "attention")
        settle(page)
        page.select_option("#bs-layer", "2")  # a layer whose alti map the page has not fetched yet
        settle(page)
        page.route("**/api/attention", lambda route: held.append(route) if '"alti"' in (route.request.post_data or "")
                   else route.continue_())
        page.route("**/api/analyze", lambda route: route.fulfill(status=500, json={"detail": "the server failed"}))
        page.select_option("#bs-measure", "alti")
        page.wait_for_function("() => document.getElementById('bs-progress').textContent.startsWith('computing')",
                               timeout=30_000)
        page.fill("#bs-text", "Yet another text.")
        page.click("#bs-submit")
        page.wait_for_selector("html[data-ready='error']", state="attached", timeout=30_000)
        # the text in the box is not the one drawn below it: said
        # (the server's line begins in lower case, as in a terminal; the page's with a capital)
        assert page.inner_text("#bs-error") == "The server failed (Below: the last text analysed, not this one.)"
        assert page.locator("#bs-head-view .bs-tok.bs-left:text-is('new')").count() == 1
        assert page.inner_text("#bs-progress") == "" and page.get_attribute("html", "data-rendered") != "0"
        page.unroute("**/api/analyze")
        page.unroute("**/api/attention")
    # the server has stopped: a layer not fetched yet cannot be drawn, and the old layer's
    # picture does not stay under the error
    page.select_option("#bs-layer", "4")
    page.wait_for_selector("html[data-rendered='error']", state="attached", timeout=30_000)
    assert "did not answer" in page.inner_text("#bs-error")
    assert page.inner_text("#bs-head-view") == "" and page.locator("#bs-head-view canvas").count() == 0
    assert not errors, errors
    page.close()


def test_notebook_frame_renders(browser, bert):
    """What Jupyter shows (_repr_html_): the explorer inside an isolated iframe, working."""
    rep = build_report(bert, IT_ANIMAL)
    page = browser.new_page()
    page.set_content(f"<html><body><p>notebook cell</p>{rep._repr_html_()}</body></html>")
    frame = page.frame_locator("iframe")
    frame.locator("html[data-ready='1']").wait_for(state="attached", timeout=30_000)
    assert frame.locator("#bs-head-view .bs-tok.bs-left").count() == len(rep.texts[0].words)
    page.close()


# ---------------------------------------------------------------------------- colour scales


def _pixel(page, selector: str, x: int, y: int) -> list[int]:
    return page.eval_on_selector(selector, f"c => Array.from(c.getContext('2d').getImageData({x}, {y}, 1, 1).data.slice(0, 3))")


def _blueness(rgb: list[int]) -> float:
    """How far a cell is from white toward the full-colour end of the scale (0 white, 1 full)."""
    return (255 - rgb[0]) / (255 - 14)


def test_diff_thumbnails_share_one_scale(browser, tmp_path):
    """Two heads whose A - B differ by 0.001 and by 0.7 at one cell: on the shared scale the
    first is (nearly) white and the second full colour; per panel both are full colour."""
    from bertscope import show

    T, N, H = 5, 2, 3
    base = np.full((N, 2, H, T, T), 1.0 / T)  # (layers, batch of A and B, heads, T, T)
    small, big = (0, 2, 1, 3), (1, 1, 2, 4)  # (layer, head, row, col): A - B = +0.001 and +0.7 there
    for (l, h, i, j), d in ((small, 0.001), (big, 0.7)):
        a_row = np.full(T, (1 - (1.0 / T + d)) / (T - 1))
        a_row[j] = 1.0 / T + d
        base[l, 0, h, i] = a_row
        b_row = np.full(T, (1 - 1.0 / T) / (T - 1))
        b_row[j] = 1.0 / T
        base[l, 1, h, i] = b_row
    tokens = ["[CLS]", "a", "b", "c", "[SEP]"]
    rep = show([torch.tensor(base[l]) for l in range(N)], tokens, tokens_b=tokens)
    path = rep.save(tmp_path / "scale.html")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(path.as_uri())
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    page.click(".bs-tab[data-view='model']")
    settle(page)
    page.click(".bs-segment button[data-text='diff']")
    settle(page)
    thumb = lambda l, h: f"canvas.bs-thumb[data-layer='{l}'][data-head='{h}']"  # noqa: E731
    vmax = float(page.get_attribute("#bs-model-view .bs-legend", "data-vmax"))
    assert abs(vmax - 0.7) < 2e-3, vmax  # the legend states the one scale: the largest |A - B| of all
    assert "±0.70" in page.inner_text("#bs-model-view .bs-legend")
    s_px = _pixel(page, thumb(small[0], small[1]), small[3], small[2])
    b_px = _pixel(page, thumb(big[0], big[1]), big[3], big[2])
    assert _blueness(b_px) > 0.95, b_px  # 0.7 of 0.7: full colour
    assert _blueness(s_px) < 0.02, s_px  # 0.001 of 0.7: white to the eye
    assert float(page.get_attribute(thumb(*small[:2]), "data-vmax")) == float(page.get_attribute(thumb(*big[:2]), "data-vmax"))
    # pointing at a thumbnail tells its value
    box = page.locator(thumb(big[0], big[1])).bounding_box()
    page.mouse.move(box["x"] + (big[3] + 0.5) * box["width"] / T, box["y"] + (big[2] + 0.5) * box["height"] / T)
    assert "+0.700" in page.inner_text("#bs-tip")

    page.select_option("#bs-scale", "panel")  # per-panel: labelled, and each panel at full colour
    settle(page)
    assert "cannot be compared" in page.inner_text("#bs-model-view .bs-legend")
    s_px = _pixel(page, thumb(small[0], small[1]), small[3], small[2])
    assert _blueness(s_px) > 0.95, s_px
    page.close()


# ---------------------------------------------------------------------------- two texts


LONGER = "The old animal didn't cross the street because it was too tired today"


def test_word_alignment_marks_unmatched_words_and_links_focus(browser, bert, hf_model, tmp_path):
    rep = build_report(bert, IT_ANIMAL, LONGER)
    page, errors = open_report(browser, rep, tmp_path / "two.html")
    unmatched = lambda panel: page.eval_on_selector_all(  # noqa: E731
        f"#bs-head-view .bs-panel[data-panel='{panel}'] .bs-tok.bs-left.bs-unmatched", "els => els.map(e => e.textContent)")
    assert unmatched(0) == [] and unmatched(1) == ["old", "today"]

    # the focus is linked: pin "it" in A, and B shows "it" (its own position) with B's numbers
    ref_b = reference(bert, hf_model, LONGER)
    wa, wb = rep.texts[0].words, rep.texts[1].words
    click_token(page, wa.index("it"), panel=0)
    values_b = shown_values(page, 1)
    assert {v["from"] for v in values_b} == {wb.index("it")}
    check_values(values_b, ref_b["words"][0, 0, wb.index("it")], "0")
    # and the other way round: pinning "cross" in B moves the focus in A to A's "cross"
    click_token(page, wb.index("cross"), panel=1)
    assert {v["from"] for v in shown_values(page, 0)} == {wa.index("cross")}
    assert {v["from"] for v in shown_values(page, 1)} == {wb.index("cross")}
    # a word without a counterpart says so in the other panel
    click_token(page, wb.index("old"), panel=1)
    assert "no counterpart" in page.inner_text("#bs-head-view .bs-panel[data-panel='0'] .bs-readout")

    # A - B pairs aligned words, not positions, and names the words it leaves out
    ref_a = reference(bert, hf_model, IT_ANIMAL)
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    note = page.inner_text("#bs-matrix-view .bs-unmatched-note")
    assert "B: old today" in note
    # and says what leaving them out does: B's shared words give them weight that A - B lacks
    unmatched_b = [wb.index("old"), wb.index("today")]
    shared_b = [i for i in range(len(wb)) if i not in unmatched_b]
    lost_b = ref_b["words"][0, 0][np.ix_(shared_b, unmatched_b)].sum(1).mean()
    shown = re.search(r"B's shared words give them ([\d.]+) of their weight", note)
    assert abs(float(shown[1]) - lost_b) <= TEXT_TOL, (note, lost_b)
    assert f"so B's rows hold {shown[1]} less on the shared words than A's, spread over their cells, and A − B " \
           "leans blue (positive)." in note
    for fx, fy in ((0.55, 0.45), (0.8, 0.7), (0.3, 0.9)):
        frm, to, val = matrix_readout(page, "diff", fx, fy)
        i, j = int(frm), int(to)  # A's word indices; B's are found by the words themselves
        bi, bj = _same_word(wa, wb, i), _same_word(wa, wb, j)
        assert abs(val - (ref_a["words"][0, 0, i, j] - ref_b["words"][0, 0, bi, bj])) <= 2 * TOL
    page.click(".bs-tab[data-view='model']")  # the model view's A - B names them too
    settle(page)
    page.click(".bs-segment button[data-text='diff']")
    settle(page)
    assert "left out of every difference: B: old today." in page.inner_text("#bs-model-view .bs-unmatched-note")

    # texts with no words in common: said plainly, no difference drawn
    rep2 = build_report(bert, IT_ANIMAL, "그 동물은 너무 피곤해서 길을 건너지 않았다")
    page.goto(rep2.save(tmp_path / "far.html").as_uri())
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    assert "too different" in page.inner_text("#bs-matrix-view")
    assert page.locator("#bs-matrix-view .bs-panel[data-panel='diff']").count() == 0
    page.click(".bs-tab[data-view='model']")
    settle(page)
    page.click(".bs-segment button[data-text='diff']")
    settle(page)
    assert "too different" in page.inner_text("#bs-model-view")
    assert not errors, errors
    page.close()


def _same_word(wa: list[str], wb: list[str], i: int) -> int:
    """B's index of A's word i, for these two texts (B = A with "old" after "The" and "today" at the end)."""
    return i if i < 2 else i + 1


def test_span_selector(browser, bert, hf_model, tmp_path):
    rep = build_report(bert, IT_ANIMAL, span="7:13")  # sub-tokens 7..12: "the street because it was too"
    path = rep.save(tmp_path / "span.html")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(path.as_uri())
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    toks = rep.texts[0].tokens
    labels = lambda: page.eval_on_selector_all(  # noqa: E731
        "#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-left", "els => els.map(e => e.textContent)")
    assert labels() == ["the", "street", "because", "it", "was", "too"] == toks[7:13]
    assert "rows not renormalised" in page.inner_text("#bs-head-view")
    ref = reference(bert, hf_model, IT_ANIMAL)
    it = rep.texts[0].words.index("it")
    click_token(page, it)
    vals = shown_values(page)
    assert sorted(v["to"] for v in vals) == list(range(7, 13))  # word indices equal token indices here
    for v in vals:  # the model's weights, not renormalised over the window
        assert abs(v["value"] - ref["words"][0, 0, it, v["to"]]) <= TOL, v
    # the control: widen the window in the page; the matrix view follows it too
    page.fill("#bs-span-start", "1")
    page.fill("#bs-span-end", "4")
    page.press("#bs-span-end", "Enter")
    settle(page)
    assert labels() == [rep.texts[0].words[w] for w in sorted(set(rep.texts[0].token_words[1:4]))]
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    frm, to, val = matrix_readout(page, "0", 0.9, 0.9)
    assert 1 <= frm < 4 and 1 <= to < 4 and abs(val - ref["words"][0, 0, int(frm), int(to)]) <= TOL
    page.click("#bs-span-all")
    settle(page)
    page.click(".bs-tab[data-view='head']")
    settle(page)
    assert len(labels()) == len(rep.texts[0].words)
    page.fill("#bs-span-start", "2")
    page.press("#bs-span-start", "Enter")
    settle(page)
    page.fill("#bs-span-start", "")  # both boxes emptied: the whole text (it read "" as 0 and 0: one token)
    page.fill("#bs-span-end", "")
    page.press("#bs-span-end", "Enter")
    settle(page)
    assert len(labels()) == len(rep.texts[0].words)
    page.close()


# ---------------------------------------------------------------------------- query-key view


def test_query_key_view_equals_trace(browser, bert, tmp_path):
    """The page's step [3] for one head and query against `trace` (which reads the model's own
    intermediates: q, k, v, scores, probabilities, context), within 1e-4."""
    from bertscope.understand.trace import trace

    layer, head = 3, 1
    rep = build_report(bert, IT_ANIMAL)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(rep.save(tmp_path / "qk.html").as_uri())
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    show_head(page, layer, head, "qk")
    tr = trace(bert, IT_ANIMAL, "it", layer, head)
    page.select_option("#bs-qk-query", str(tr.token_index))
    settle(page)
    rows = page.eval_on_selector_all("#bs-qk-view tr.bs-qk-row", "els => els.map(e => ({key: +e.dataset.key, "
                                     "raw: +e.dataset.raw, scaled: +e.dataset.scaled, weight: +e.dataset.weight}))")
    assert [r["key"] for r in rows] == list(range(len(tr.tokens)))
    for r in rows:
        assert abs(r["raw"] - float(tr.raw_scores[r["key"]])) <= 1e-4, r
        assert abs(r["scaled"] - float(tr.scores[r["key"]])) <= 1e-4, r
        assert abs(r["weight"] - float(tr.weights[r["key"]])) <= 1e-4, r
    q = np.array([float(x) for x in page.get_attribute("#bs-qk-query-vec", "data-values").split(",")])
    ctx = np.array([float(x) for x in page.get_attribute("#bs-qk-context", "data-values").split(",")])
    assert np.abs(q - tr.query.numpy()).max() <= 1e-6  # stored exactly: the model's own q
    assert np.abs(ctx - tr.context.numpy()).max() <= 1e-4  # Σ weight·v, the model's context
    top = max(rows, key=lambda r: r["weight"])
    assert rep.texts[0].tokens[top["key"]] == "animal"  # S12, seen step by step
    assert "(the first" not in page.inner_text("#bs-qk-view h3")
    page.click(".bs-tab[data-view='head']")  # two heads selected: the query-key view says it shows the first
    settle(page)
    page.click(".bs-head[data-head='5']", modifiers=["Shift"])
    settle(page)
    page.click(".bs-tab[data-view='qk']")
    settle(page)
    assert page.inner_text("#bs-qk-view h3").startswith(
        f"layer {layer}, head {head} (the first of the 2 heads selected: this view shows one): how")
    page.close()


# ---------------------------------------------------------------------------- any model's attention


def test_show_of_hf_attentions_renders_and_equals_bertscope(browser, bert, hf_model, tmp_path):
    from bertscope import show

    b = bert.encode([IT_ANIMAL])
    with torch.inference_mode():
        out = hf_model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                       token_type_ids=b.token_type_ids, output_attentions=True)
    import transformers

    hf_tok = transformers.AutoTokenizer.from_pretrained(str(bert.path))
    tokens = hf_tok.convert_ids_to_tokens(b.input_ids[0].tolist())
    rep = show(out.attentions, tokens)
    own = build_report(bert, IT_ANIMAL)
    np.testing.assert_allclose(rep.texts[0].attentions, own.texts[0].attentions, atol=1e-5)
    assert [w.lower() for w in rep.texts[0].words] == [w.lower() for w in own.texts[0].words]  # words rebuilt from "##" pieces
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(rep.save(tmp_path / "show.html").as_uri())
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    show_head(page, 5, 11)
    it = rep.texts[0].words.index("it")
    click_token(page, it)
    from bertscope.core.words import word_attention

    mine = word_attention(torch.from_numpy(own.texts[0].attentions), own.texts[0].token_words).numpy()
    check_values(shown_values(page), mine[5, 11, it], "11")
    assert not errors, errors
    page.close()


# ---------------------------------------------------------------------------- a 512-token page


OBSERVE = """
window.__longtasks = [];
window.__paint = {};
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__longtasks.push(e.duration); })
  .observe({type: "longtask", buffered: true});
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__paint[e.name] = e.startTime; })
  .observe({type: "paint", buffered: true});
"""


def test_512_token_page_works_and_records_its_paint_and_longest_tasks(browser, bert, tmp_path):
    """512 tokens of a BERT-base-sized model (12 x 12 heads, random weights made peaky): under
    30 MB, every view works without a page error and shows the model's numbers. Its first paint
    and each interaction's longest main-thread task are measured inside the page (Paint Timing,
    Long Tasks API) and written to test-artifacts/long-report.txt, not asserted: speed is for
    benchmarks, and a slower CPU must not fail a test."""
    import warnings

    from bertscope import Bert, BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig.preset("bert-base")
    model = BertModel(cfg).eval()
    with torch.no_grad():
        for layer in model.layers:  # sharper attention than random weights give: many strong lines
            layer.attention.query.weight.mul_(12.0)
    big = Bert(config=cfg, model=model, tokenizer=bert.tokenizer, name="bert-base (random)")
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
    page.add_init_script(OBSERVE)
    page.goto(path.as_uri(), wait_until="commit")
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
    paint = page.evaluate("window.__paint")  # recorded in the artifact below, never judged (a CPU's speed)
    assert "first-contentful-paint" in paint, paint  # the page painted, and the browser measured it
    page.evaluate("window.__longtasks = []")  # loading is not an interaction; what follows is

    def interact(action) -> float:
        action()
        settle(page)
        page.wait_for_timeout(100)  # let a task that ends the interaction be reported
        worst = max(page.evaluate("window.__longtasks"), default=0.0)
        page.evaluate("window.__longtasks = []")
        return worst

    worst = {
        "click a token": interact(lambda: click_token(page, 100)),
        "all heads": interact(lambda: page.click("#bs-heads-all")),
        "model view": interact(lambda: page.click(".bs-tab[data-view='model']")),
        "matrix view": interact(lambda: page.click(".bs-tab[data-view='matrix']")),
        "zoom in": interact(lambda: page.click("#bs-matrix-view button[data-zoom='1']")),
        "a window of tokens": interact(lambda: (page.fill("#bs-span-start", "100"), page.fill("#bs-span-end", "300"),
                                                page.press("#bs-span-end", "Enter"))),
        "head view": interact(lambda: page.click(".bs-tab[data-view='head']")),
    }
    with artifact("long-report.txt").open("w") as f:
        f.write(f"512 tokens, 12 layers x 12 heads: {size / 1e6:.1f} MB; first paint "
                f"{paint.get('first-contentful-paint'):.0f} ms; longest main-thread task per interaction (ms): {worst}\n")
    assert not errors, errors
    # and the page tells the model's numbers: a token's row matches
    click_token(page, 150)
    vals = [v for v in shown_values(page) if v["head"] == "0"]
    row = rep.texts[0].attentions[0, 0]
    tw = np.array(rep.texts[0].token_words)
    expected = np.zeros(tw.max() + 1)
    np.add.at(expected, tw, row[np.where(tw == 150)[0]].mean(0))
    assert vals and max(abs(v["value"] - expected[v["to"]]) for v in vals) <= TOL
    page.close()


def test_measure_switch_changes_lines_and_values(browser, bert, tmp_path):
    """`view --measure`: the page's Measure switch redraws the lines from another measure, and the
    numbers it shows are bertscope.explain's maps (word level, the explain record's own rule)."""
    from bertscope import explain
    from bertscope.explain import map_measures

    rep = build_report(bert, IT_ANIMAL, measures=lambda b, text, pair: map_measures(b, text, ["norm", "alti"], pair=pair))
    path = rep.save(tmp_path / "measures.html")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    it = rep.texts[0].words.index("it")
    alti = explain(bert, IT_ANIMAL, "alti").word_maps()  # (N, W, W)
    norm = explain(bert, IT_ANIMAL, "norm").word_maps()  # (N, H, W, W)

    assert page.is_visible("#bs-measure")
    attention_lines = lines_image(page)
    page.select_option("#bs-measure", "alti")
    settle(page)
    assert lines_image(page) != attention_lines  # the switch changes the drawn lines
    assert page.get_attribute("#bs-head-view .bs-panel[data-panel='0']", "data-heads") == "alti"
    assert page.is_disabled(".bs-head[data-head='0']") and page.is_disabled("#bs-mode")  # per layer: no heads
    click_token(page, it)
    check_values(shown_values(page), alti[0, it], "alti")
    page.select_option("#bs-layer", "4")
    settle(page)
    check_values(shown_values(page), alti[4, it], "alti")

    page.select_option("#bs-measure", "norm")  # per head: the head choices come back
    settle(page)
    assert page.is_enabled(".bs-head[data-head='1']")
    page.click(".bs-head[data-head='1']")
    settle(page)
    check_values(shown_values(page), norm[4, 1, it], "1")

    page.click(".bs-head[data-head='3']", modifiers=["Shift"])  # heads 1 and 3: their mean, said so
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    assert page.inner_text("#bs-matrix-view .bs-panel h3") == "norm, layer 4, heads 1, 3 (their mean)"
    assert "Several heads selected: their mean." in page.inner_text("#bs-hint")
    page.select_option("#bs-measure", "alti")  # per layer: no heads, so no mean of them
    settle(page)
    assert page.inner_text("#bs-matrix-view .bs-panel h3") == "alti, layer 4"
    assert "Several heads" not in page.inner_text("#bs-hint")
    plus = "#bs-matrix-view button[data-zoom='1']"
    for _ in range(12):  # up to the largest cell, where "+" can do nothing and says so
        if page.is_disabled(plus):
            break
        page.click(plus)
        settle(page)
    assert page.is_disabled(plus) and "32 px per cell" in page.inner_text("#bs-matrix-view .bs-zoom")
    assert page.is_enabled("#bs-matrix-view button[data-zoom='-1']")
    page.click(".bs-tab[data-view='model']")
    settle(page)
    heads = page.eval_on_selector_all("#bs-model-view canvas.bs-thumb", "els => els.map(e => e.dataset.head)")
    assert heads == ["alti"] * rep.num_layers  # one thumbnail per layer

    page.select_option("#bs-measure", "attention")
    settle(page)
    heads = page.eval_on_selector_all("#bs-model-view canvas.bs-thumb", "els => els.map(e => e.dataset.head)")
    assert len(heads) == rep.num_layers * (rep.num_heads + 2)
    assert not errors, errors
    page.close()


def test_a_cut_text_says_so_first(browser, bert, tmp_path):
    """"(truncated to fit the model)" followed the whole text inside a box of 4.3 lines: it was
    seen only by scrolling that box. The note comes first and says how many tokens were kept."""
    from bertscope import TruncationWarning

    with pytest.warns(TruncationWarning):
        rep = build_report(bert, "the cat sat on the mat " * 100)
    page, errors = open_report(browser, rep, tmp_path / "cut.html")
    settle(page)
    first = page.eval_on_selector("#bs-texts div", "d => d.firstChild.textContent")
    assert first == "cut to its first 512 tokens to fit the model: "
    assert page.eval_on_selector("#bs-texts div .bs-cut", "e => { const r = e.getBoundingClientRect(); "
                                 "const box = e.parentElement.getBoundingClientRect(); "
                                 "return r.top >= box.top && r.bottom <= box.bottom; }")  # in view, unscrolled
    assert not errors, errors
    page.close()
    with pytest.warns(TruncationWarning):  # compared: after the text's letter, so B is the one cut
        rep = build_report(bert, "The cat sat.", "the cat sat on the mat " * 100)
    page, errors = open_report(browser, rep, tmp_path / "cut2.html")
    settle(page)
    second = page.eval_on_selector_all("#bs-texts div:nth-child(2) > *", "els => els.map(e => e.textContent)")
    assert second[:2] == ["B", "cut to its first 512 tokens to fit the model: "], second
    assert page.locator("#bs-texts div:nth-child(1) .bs-cut").count() == 0
    assert not errors, errors
    page.close()


def test_the_numbers_of_all_twelve_heads_fit_beside_the_lines(browser, bert, tmp_path):
    """With every head shown, the pinned numbers stopped at head 3 (a box of 460 px, headers
    wrapping onto two lines) while half the screen stood empty."""
    rep = build_report(bert, "The quick brown fox jumps over the lazy dog while the committee deliberated.")
    page, errors = open_report(browser, rep, tmp_path / "heads.html", 1400, 900)
    settle(page)
    page.click("#bs-heads-all")
    settle(page)
    click_token(page, 5)
    heads = page.eval_on_selector_all(".bs-readout th[title^='head']", "els => els.map(e => e.textContent)")
    assert heads == [f"h{h}" for h in range(12)]
    right, box = page.evaluate("() => { const ro = document.querySelector('.bs-readout'); const th = "
                               "[...ro.querySelectorAll('th')].pop(); return [th.getBoundingClientRect().right, "
                               "Math.min(ro.getBoundingClientRect().right, innerWidth)]; }")
    assert right <= box, (right, box)  # the last column in view, no sideways scroll
    page.set_viewport_size({"width": 400, "height": 900})  # narrow: the box stays on the screen and scrolls
    page.click(".bs-tab[data-view='head']")
    settle(page)
    click_token(page, 5)
    edge = page.evaluate("() => document.querySelector('.bs-readout').getBoundingClientRect().right")
    assert edge <= 400, edge
    assert not errors, errors
    page.close()


# every box that selector matches, where it is on the screen now
_BOXES = ("sel => [...document.querySelectorAll(sel)].map(e => { const r = e.getBoundingClientRect(); "
          "return [r.left, r.top, r.width, r.height]; })")
# whether any of them moved or changed size since `rest`
_ANY_MOVED = ("((sel, rest) => { const now = (" + _BOXES + ")(sel); return now.length !== rest.length || "
              "now.some((b, i) => b.some((v, k) => Math.abs(v - rest[i][k]) > 0.5)); })")


def _moved(page, selector: str, rest: list) -> float:
    """How far (px) the farthest of the boxes moved or changed size since ``rest``."""
    now = page.evaluate(_BOXES, selector)
    assert len(now) == len(rest), (len(now), len(rest))
    return max(abs(v - w) for b, c in zip(now, rest) for v, w in zip(b, c))


def _point_at(page, selector: str, moving: str, rest: list, done: str) -> float:
    """Rest the pointer on the middle of ``selector``; once ``done`` (a JS expression) holds,
    how far the ``moving`` boxes went."""
    box = page.locator(selector).bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    # the hover has taken, or something moved already (then the assertion says how far)
    page.wait_for_function(f"([sel, rest]) => ({done}) || {_ANY_MOVED}(sel, rest)", arg=[moving, rest],
                           timeout=30_000)
    return _moved(page, moving, rest)


def test_hovering_moves_no_token_and_no_heatmap(browser, bert, tmp_path):
    """A head panel's readout was as big as what it showed: a note, or a table (a wider one for
    several heads). Hovering a token changed it, and the panel beside or below it moved (up to
    ~1000 px: B went up beside A, or down by 227 px on a narrow screen), so the token under a
    resting pointer changed and the focus jumped or flickered. The matrix view's readout did the
    same to the heatmaps (16 px). Nothing moves, wide or narrow, with one head or all twelve."""
    rep = build_report(bert, IT_ANIMAL, WIDE)
    wa, wb = rep.texts[0].words, rep.texts[1].words
    # (panel, side, unit): tables in both panels (the focus is linked), a word without counterpart
    # ("wide": a short note in A), the last token; the pointer crosses from panel to panel
    hovers = [(0, "left", wa.index("it")), (1, "right", wb.index("wide")), (0, "right", wa.index("tired")),
              (1, "left", 0), (0, "left", len(wa) - 1), (1, "left", wb.index("animal"))]
    toks = "#bs-head-view .bs-tok"
    for width in (1600, 2400, 420):  # B below A (beside it if A narrowed), B beside A, narrow
        height = 2600  # the whole page in view: nothing scrolls, the pointer rests where it was put
        page, errors = open_report(browser, rep, tmp_path / f"hover{width}.html", width, height)
        settle(page)
        for heads in ("one", "all"):
            if heads == "all":  # a table of 13 columns, in the wide readout
                page.click("#bs-heads-all")
                settle(page)
            rest = page.evaluate(_BOXES, toks)
            assert max(b[1] + b[3] for b in rest) <= height  # every token in view
            for panel, side, i in hovers:
                tok = f"#bs-head-view .bs-panel[data-panel='{panel}'] .bs-tok.bs-{side}[data-i='{i}']"
                focused = f"document.querySelector(\"{tok}\").classList.contains('bs-focus')"
                moved = _point_at(page, tok, toks, rest, focused)
                assert moved <= 0.5, (width, heads, panel, side, i, moved)
                assert page.eval_on_selector(tok, "e => e.classList.contains('bs-focus')"), (width, heads, tok)
            assert page.locator("#bs-head-view .bs-readout table").count() == 2
            assert "no counterpart" not in page.inner_text("#bs-head-view")  # "animal" has one
            # off the tokens: both readouts say what to do again
            moved = _point_at(page, "#bs-hint", toks, rest, "!document.querySelector('#bs-head-view .bs-focus')")
            assert moved <= 0.5, (width, heads, "left", moved)
        page.click(".bs-tab[data-view='matrix']")
        settle(page)
        maps = "#bs-matrix-view canvas.bs-grid"
        rest = page.evaluate(_BOXES, maps)
        assert len(rest) >= 3 and max(b[1] + b[3] for b in rest) <= height  # A, B, A - B (per head)
        for key in ("0", "1", "diff"):
            out = f"#bs-matrix-view .bs-panel[data-panel='{key}'] .bs-mreadout"
            moved = _point_at(page, f"#bs-matrix-view .bs-panel[data-panel='{key}'] canvas.bs-grid", maps, rest,
                              f"document.querySelector(\"{out}\").dataset.value !== undefined")
            assert moved <= 0.5, (width, key, moved)
            assert page.get_attribute(out, "data-value") is not None
        assert not errors, errors
        page.close()


def test_a_long_map_of_lengths_draws_its_strongest_lines_and_says_so(browser, bert, tmp_path):
    """norm (vector lengths, drawn against the layer's largest) put nearly every one of n² lines
    above the drawing floor: 461 tokens took 11 s to draw, a solid band. Such a map keeps its 50
    strongest lines per token and the panel says so; the attention weights (shares) do not."""
    from bertscope.explain import map_measures

    text = "The animal didn't cross the street because it was too tired. " * 10  # 151 tokens
    rep = build_report(bert, text, measures=lambda b, t, pair: map_measures(b, t, ["norm"], pair=pair))
    page, errors = open_report(browser, rep, tmp_path / "norm.html")
    settle(page)
    n = len(rep.texts[0].tokens)
    assert page.locator("#bs-head-view .bs-thinned").count() == 0  # shares: their own floor
    page.select_option("#bs-measure", "norm")
    settle(page)
    assert page.inner_text("#bs-head-view .bs-thinned") == (
        f"lines: the {50 * n:,} strongest of {n * n:,} (norm: lengths, not shares of a row); "
        "hover a token for its own")
    lines = int(page.get_attribute("#bs-head-view .bs-panel[data-panel='0']", "data-lines"))
    # at most the 50 strongest per unit shown (words here, n tokens at most; an exact tie at the cut adds one)
    assert 0 < lines <= 51 * n, (lines, n)
    assert not errors, errors
    page.close()


def test_no_measure_switch_without_measures(browser, bert, tmp_path):
    path = build_report(bert, "A short text.").save(tmp_path / "plain.html")
    page = browser.new_page()
    page.goto(path.as_uri())
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    assert not page.is_visible("#bs-measure")  # the page of today: attention only
    page.close()


def test_keyboard_sticky_headers_and_a_narrow_screen(browser, bert, tmp_path):
    """Tab to a token and Enter pins its numbers; the query-key table's sticky header sits below
    the sticky controls (it was hidden under them); at 420 px nothing widens the page."""
    rep = build_report(bert, " ".join(["The animal didn't cross the street because it was too tired."] * 4))
    page, errors = open_report(browser, rep, tmp_path / "keys.html", 1280, 700)
    settle(page)
    col = "#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-left"
    assert page.eval_on_selector_all(col, "els => els.filter(e => e.tabIndex === 0).length") == 1  # one tab stop
    page.focus(f"{col}[data-i='0']")
    for _ in range(3):
        page.keyboard.press("ArrowDown")  # along the column
    assert page.evaluate("() => document.activeElement.dataset.i") == "3"
    page.keyboard.press("Enter")
    assert shown_values(page), "Enter on a focused token pins its numbers"
    assert page.eval_on_selector(f"{col}[data-i='3']", "e => e.classList.contains('bs-pinned')")
    # the pinned state is told to assistive technology, not only drawn
    assert page.eval_on_selector_all(f"{col}[aria-pressed='true']", "els => els.map(e => e.dataset.i)") == ["3"]
    assert page.get_attribute(".bs-tab[data-view='qk']", "role") == "tab"
    assert page.get_attribute(".bs-tab[data-view='head']", "aria-controls") == "bs-head-view"
    assert page.get_attribute("#bs-head-view", "role") == "tabpanel"
    # the tab list: one tab stop, the arrows move between tabs and show each view
    assert page.eval_on_selector_all(".bs-tab", "els => els.map(e => e.tabIndex)") == [0, -1, -1, -1]
    page.focus(".bs-tab[data-view='head']")
    page.keyboard.press("ArrowRight")
    settle(page)
    assert page.evaluate("() => document.activeElement.dataset.view") == "model"
    assert page.is_visible("#bs-model-view") and page.is_hidden("#bs-head-view")
    # the thumbnails are one tab stop; the arrows move among them, Enter opens one: layer 2's
    # head 5 in the head view, with the focus on its tokens (not back at the page's start)
    stops = page.eval_on_selector_all("#bs-model-view canvas.bs-thumb", "els => els.map(e => e.tabIndex)")
    assert len(stops) == 6 * 14 and stops.count(0) == 1 and stops[0] == 0  # 12 heads, mean, rollout
    page.focus("#bs-model-view canvas.bs-thumb[tabindex='0']")
    for key in ["ArrowDown"] * 2 + ["ArrowRight"] * 6 + ["ArrowLeft"]:
        page.keyboard.press(key)
    assert page.evaluate("() => document.activeElement.getAttribute('aria-label')") == "layer 2, head 5"
    page.keyboard.press("Enter")
    settle(page)
    assert page.is_visible("#bs-head-view") and page.input_value("#bs-layer") == "2"
    assert page.eval_on_selector_all(".bs-head[aria-pressed='true']", "els => els.map(e => e.dataset.head)") == ["5"]
    assert page.evaluate("() => document.activeElement.classList.contains('bs-tok')")
    page.focus(".bs-tab[data-view='head']")
    page.keyboard.press("End")
    page.keyboard.press("ArrowRight")  # wraps around to the first
    settle(page)
    assert page.evaluate("() => document.activeElement.dataset.view") == "head"
    page.click(".bs-tab[data-view='qk']")
    settle(page)
    bar, top = page.evaluate("() => [document.getElementById('bs-controls').offsetHeight, "
                             "parseFloat(getComputedStyle(document.querySelector('.bs-qk-table th')).top)]")
    assert bar > 0 and top == bar, (bar, top)
    page.set_viewport_size({"width": 420, "height": 800})
    for view in ("head", "model", "matrix", "qk"):
        page.click(f".bs-tab[data-view='{view}']")
        settle(page)
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 420, (view, width)
        # nothing in the view is cut off: what is wider scrolls inside its own box, where the
        # notes above it stay whole (the whole view scrolled sideways, or a matrix panel was cut)
        inside = page.evaluate(f"() => document.getElementById('bs-{view}-view').scrollWidth")
        assert inside <= 420 - 18, (view, inside)
        if view == "head":  # both token columns in view: the band between them narrows (it ran off the edge)
            right = page.eval_on_selector_all("#bs-head-view .bs-tok.bs-right",
                                              "els => Math.max(...els.map(e => e.getBoundingClientRect().right))")
            assert right <= 420, right
        if view in ("model", "qk"):  # the table scrolls sideways; its row names stay in view
            box = f"#bs-{view}-view .bs-xscroll"
            assert page.eval_on_selector(box, "e => e.scrollWidth > e.clientWidth")
            page.eval_on_selector(box, "e => { e.scrollLeft = 300; }")
            name = page.eval_on_selector(f"{box} tr:nth-child(2) > :first-child", "e => e.getBoundingClientRect().left")
            assert 0 <= name <= 30, (view, name)
        if view == "matrix":  # the readout under the map is whole
            right = page.eval_on_selector("#bs-matrix-view .bs-mreadout", "e => e.getBoundingClientRect().right")
            assert right <= 420, right
    assert page.evaluate("() => getComputedStyle(document.getElementById('bs-controls')).position") == "static"
    page.screenshot(path=str(artifact("narrow-qk-view.png")), full_page=True)
    page.set_viewport_size({"width": 360, "height": 800})  # a small phone: the token columns narrow too
    page.click(".bs-tab[data-view='head']")
    settle(page)
    right = page.eval_on_selector_all("#bs-head-view .bs-tok.bs-right",
                                      "els => Math.max(...els.map(e => e.getBoundingClientRect().right))")
    assert right <= 360 - 18 and page.evaluate("() => document.getElementById('bs-head-view').scrollWidth") <= 342
    assert not errors, errors
    page.close()


def test_pair_marks_segment_b_and_a_file_without_qkv_switches_its_controls_off(browser, bert, tmp_path):
    """The query-key view of a sentence pair marks where segment B begins (the tokenizer's
    own segment ids say where); the pinned numbers line up whatever their bars; a file without
    q, k, v switches off the controls its query-key view cannot use; at 420 px the query-key
    table's header does not stick inside the sideways-scrolling view."""
    from transformers import AutoTokenizer

    a, b = "The animal didn't cross the street.", "It was too tired."
    type_ids = AutoTokenizer.from_pretrained(bert.path)(a, b)["token_type_ids"]
    first_b = type_ids.index(1)
    rep = build_report(bert, a, pair=b, qk=True)
    page, errors = open_report(browser, rep, tmp_path / "pair.html")
    settle(page)
    click_token(page, 2)
    settle(page)
    rights = page.eval_on_selector_all(
        "#bs-head-view .bs-panel[data-panel='0'] td.bs-val",
        "els => els.map(e => { const r = document.createRange(); r.selectNodeContents(e.firstChild); "
        "return r.getBoundingClientRect().right; })")
    assert len(rights) == len(type_ids) and max(rights) - min(rights) < 1.0, rights  # aligned
    page.click(".bs-tab[data-view='qk']")
    settle(page)
    seg = page.eval_on_selector_all("#bs-qk-view tr", "els => els.map(e => e.className)")
    at = seg.index("bs-qk-seg")
    assert at - 1 == first_b, (seg, first_b)  # the marker row comes right before B's first token
    options = page.eval_on_selector_all("#bs-qk-query option", "els => els.map(e => e.textContent)")
    assert [o.endswith("(B)") for o in options] == [t == 1 for t in type_ids]
    assert not page.is_disabled("#bs-layer") and not page.is_disabled("#bs-hide-special")
    page.set_viewport_size({"width": 420, "height": 800})
    # the header does not stick to the top (the view scrolls sideways); the key column sticks left
    assert page.evaluate("() => getComputedStyle(document.querySelector('.bs-qk-table th:nth-child(2)')).position") \
        == "static"
    assert page.evaluate("() => getComputedStyle(document.querySelector('.bs-qk-table th')).top") == "auto"
    page.close()

    rep = build_report(bert, a, qk=False)
    page, errors2 = open_report(browser, rep, tmp_path / "noqk.html")
    settle(page)
    page.click(".bs-tab[data-view='qk']")
    settle(page)
    assert "does not hold the queries" in page.inner_text("#bs-qk-view")
    for sel in ("#bs-layer", "#bs-hide-special", "#bs-span-start", "#bs-span-end", ".bs-head[data-head='0']"):
        assert page.is_disabled(sel), sel
    page.click(".bs-tab[data-view='head']")
    settle(page)
    assert not page.is_disabled("#bs-layer") and not page.is_disabled("#bs-span-start")
    assert not errors and not errors2, errors + errors2
    page.close()


def test_the_address_holds_the_view_and_a_link_opens_on_it(browser, bert, hf_model, tmp_path):
    """A link could not open on "layer 3, head 1, it -> animal": the view's settings were in
    no address. They go after "#", from a file's page and from `bertscope serve`."""
    from urllib.parse import parse_qs, urlencode, urlsplit

    rep = build_report(bert, IT_ANIMAL, WIDE)
    path = rep.save(tmp_path / "two.html")
    page, errors = open_report(browser, rep, path)
    assert urlsplit(page.url).fragment == ""  # how the page opens: nothing to say
    it, animal = rep.texts[0].words.index("it"), rep.texts[0].words.index("animal")
    show_head(page, 3, 1)
    click_token(page, it)
    assert parse_qs(urlsplit(page.url).fragment) == {"layer": ["3"], "heads": ["1"], "pin": [f"A.left.{it}"]}
    link = page.url
    page.close()

    page, errors = open_report(browser, rep, path)  # the link opens on the same picture
    page.goto(link)
    page.reload()
    page.wait_for_selector("html[data-ready='1']", state="attached", timeout=30_000)
    assert page.input_value("#bs-layer") == "3"
    values = shown_values(page)
    check_values(values, reference(bert, hf_model, IT_ANIMAL)["words"][3, 1, it], "1")
    assert max(values, key=lambda v: v["value"])["to"] == animal
    # an edited address: the settings it leaves out go back to their defaults
    page.evaluate("location.hash = '#view=matrix&level=token&heads=2,11'")
    settle(page)
    assert page.get_attribute(".bs-tab[data-view='matrix']", "aria-selected") == "true"
    assert page.input_value("#bs-layer") == "0" and page.input_value("#bs-level") == "token"
    assert page.eval_on_selector_all(".bs-head[aria-pressed='true']", "els => els.map(e => e.dataset.head)") == ["2", "11"]
    # what does not fit the text shown is left at its default, and said
    page.evaluate("location.hash = '#layer=9&heads=1&pin=B.left.400'")
    settle(page)
    assert page.input_value("#bs-layer") == "0"
    assert page.eval_on_selector_all(".bs-head[aria-pressed='true']", "els => els.map(e => e.dataset.head)") == ["1"]
    assert "(layer=9, pin=B.left.400): left at the default" in page.inner_text(".bs-address-note")
    page.evaluate("location.hash = '#special=hidden&pin=A.left.0'")  # [CLS], hidden: no pin to show
    settle(page)
    assert "(pin=A.left.0): left at the default" in page.inner_text(".bs-address-note")
    # a key given twice, a key that is no setting, a value 20,000 characters long: each named, short
    page.evaluate("location.hash = '#layer=2&layer=5&foo=bar&heads=' + 'x'.repeat(20000)")
    settle(page)
    note = page.inner_text(".bs-address-note")
    assert page.input_value("#bs-layer") == "2" and len(note) < 300, note
    assert "layer=5 (repeated: only the first is read)" in note and "foo (not a setting)" in note, note
    # a pin the page's own settings then hide goes from the picture and from the address (a link
    # to it named it as unusable)
    page.evaluate("location.hash = ''")
    settle(page)
    click_token(page, 0)  # [CLS]
    assert "pin=A.left.0" in page.url
    page.check("#bs-hide-special")
    settle(page)
    assert "pin=" not in page.url
    assert not errors, errors
    page.close()

    with served() as base:  # the texts in the query, the view after "#"
        query = "?" + urlencode({"text": IT_ANIMAL}) + "#view=qk&layer=2&heads=4"
        page, errors = open_served(browser, base, query)
        assert page.get_attribute(".bs-tab[data-view='qk']", "aria-selected") == "true"
        assert page.input_value("#bs-layer") == "2"
        page.fill("#bs-text", WIDE)  # a new text keeps the view
        page.click("#bs-submit")
        page.wait_for_function("() => location.search.includes('wide')")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert parse_qs(urlsplit(page.url).fragment) == {"view": ["qk"], "layer": ["2"], "heads": ["4"]}
        page.click(".bs-tab[data-view='matrix']")
        settle(page)
        page.go_back()  # the first text, with the view it had
        page.wait_for_function("() => document.getElementById('bs-text').value.includes('too tired')")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert page.get_attribute(".bs-tab[data-view='qk']", "aria-selected") == "true"
        page.go_forward()  # and the second, with the view it was left on
        page.wait_for_function("() => document.getElementById('bs-text').value.includes('too wide')")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert page.get_attribute(".bs-tab[data-view='matrix']", "aria-selected") == "true"
        # Back, then Forward before Back's text came: Back's answer replaced the entry Forward
        # went to (its text shown there, under its address); and a text asked for meanwhile took
        # Back's view
        held: list = []
        page.route("**/api/analyze", lambda route: held.append(route))
        page.go_back()
        page.wait_for_function("() => document.getElementById('bs-text').value.includes('too tired')")
        page.go_forward()
        page.wait_for_function("() => document.getElementById('bs-text').value.includes('too wide')")
        page.unroute("**/api/analyze")
        for route in held:  # Back's request, aborted by the page: answering it changes nothing
            try:
                route.continue_()
            except Exception:
                pass
        page.wait_for_timeout(300)
        shown_text = "() => window.bertscope.meta.texts[0].text"
        assert page.evaluate(shown_text) == WIDE and parse_qs(urlsplit(page.url).query) == {"text": [WIDE]}
        assert page.get_attribute("html", "data-ready") == "1" and page.inner_text("#bs-form-status") == ""
        assert page.get_attribute(".bs-tab[data-view='matrix']", "aria-selected") == "true"
        page.go_back()  # the first entry still holds the first text
        page.wait_for_function("() => document.getElementById('bs-text').value.includes('too tired')")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        assert parse_qs(urlsplit(page.url).query) == {"text": [IT_ANIMAL]} and page.evaluate(shown_text) == IT_ANIMAL
        page.click(".bs-tab[data-view='head']")
        settle(page)
        held.clear()
        page.route("**/api/analyze", lambda route: route.continue_() if "third" in (route.request.post_data or "")
                   else held.append(route))
        page.go_forward()  # asks for WIDE with its matrix view, held ...
        page.wait_for_function("() => document.getElementById('bs-text').value.includes('too wide')")
        page.fill("#bs-text", "A third text.")  # ... and the user asks for another text meanwhile
        page.click("#bs-submit")
        page.wait_for_selector("#bs-head-view .bs-tok.bs-left:text-is('third')", timeout=60_000)
        for route in held:
            try:
                route.continue_()
            except Exception:
                pass
        page.unroute("**/api/analyze")
        settle(page)
        assert page.get_attribute(".bs-tab[data-view='head']", "aria-selected") == "true"  # the view shown goes on
        assert page.evaluate(shown_text) == "A third text." and page.get_attribute("html", "data-ready") == "1"
        # the same onto a text too long for the address: the box gets that text back, not the sample
        long_text = "é漢 " * 600
        page.fill("#bs-text", long_text)
        page.click("#bs-submit")
        page.wait_for_function("() => location.search === ''")
        page.wait_for_selector("html[data-ready='1']", state="attached", timeout=60_000)
        page.route("**/api/analyze", lambda route: held.append(route))
        page.go_back()
        page.wait_for_function("() => document.getElementById('bs-text').value === 'A third text.'")
        page.go_forward()
        page.wait_for_function("() => document.documentElement.dataset.ready === '1'")
        page.unroute("**/api/analyze")
        assert page.input_value("#bs-text") == long_text and page.evaluate(shown_text) == long_text
        assert not errors, errors
        page.close()


# ---------------------------------------------------------------------------- accessibility


@pytest.fixture(scope="module")
def compared(bert, tmp_path_factory):
    """The saved report of two texts (A "... too tired", B "... too wide"), for the tests below."""
    rep = build_report(bert, IT_ANIMAL, WIDE)
    return rep, rep.save(tmp_path_factory.mktemp("a11y") / "compare.html")


def _active(page) -> str:
    """The focused element, as text: BODY when the focus fell back to the page's start."""
    return page.evaluate("() => { const a = document.activeElement; return a.tagName + ' ' + "
                         "(a.id || a.dataset.zoom || a.dataset.text || a.textContent.slice(0, 20)); }")


def _press_and_wait(page, key: str, done: str) -> None:
    """Press key on the focused element; wait until the JS condition done holds, then the render."""
    page.keyboard.press(key)
    page.wait_for_function(done, timeout=30_000)
    settle(page)


def test_a_control_that_redraws_its_view_keeps_the_focus(browser, compared):
    """Enter on the zoom buttons, on A / B / A − B, or an arrow key on the query-token select
    rebuilt the view with the control in it, and the focus fell back to the page's start (the
    next Tab began again at the top, the select's next arrow did nothing)."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    fit = page.evaluate("() => document.querySelector('#bs-matrix-view .bs-zoom .bs-label:last-child').textContent")
    assert fit.startswith("26 px"), fit  # the fitted cell, one step below the largest (32)
    page.focus("#bs-matrix-view button[data-zoom='-1']")
    _press_and_wait(page, "Enter", "() => bertscope.state.zoom === 22")
    assert _active(page) == "BUTTON -1"
    page.focus("#bs-matrix-view button[data-zoom='1']")
    _press_and_wait(page, "Enter", "() => bertscope.state.zoom === 26")
    assert _active(page) == "BUTTON 1"
    # the largest zoom switches "+" off: the focus goes on to the control beside it, "fit"
    _press_and_wait(page, "Enter", "() => bertscope.state.zoom === 32")
    assert page.is_disabled("#bs-matrix-view button[data-zoom='1']")
    assert _active(page) == "BUTTON fit"
    _press_and_wait(page, "Enter", "() => bertscope.state.zoom === null")
    assert _active(page) == "BUTTON fit"

    page.click(".bs-tab[data-view='model']")
    settle(page)
    page.focus("#bs-model-view .bs-segment button[data-text='diff']")
    _press_and_wait(page, "Enter", "() => bertscope.state.modelText === 'diff'")
    assert _active(page) == "BUTTON diff"
    assert page.evaluate("() => document.activeElement.getAttribute('aria-pressed')") == "true"

    page.click(".bs-tab[data-view='qk']")
    settle(page)
    page.focus("#bs-qk-view .bs-segment button[data-text='1']")
    _press_and_wait(page, "Enter", "() => bertscope.state.qkText === 1")
    assert _active(page) == "BUTTON 1"
    page.focus("#bs-qk-query")
    first = int(page.input_value("#bs-qk-query"))
    for step in (1, 2, 3):  # each arrow steps on from the query the last one chose
        _press_and_wait(page, "ArrowDown", f"() => bertscope.state.qkQuery === {first + step}")
        assert _active(page) == "SELECT bs-qk-query" and int(page.input_value("#bs-qk-query")) == first + step
    assert not errors, errors
    page.close()


def test_head_view_tokens_say_their_side_and_a_focused_token_is_announced(browser, compared):
    """The left and right columns read as the same buttons, and the numbers a focused or pinned
    token shows were never said: each token's name has its side and position, each column is a
    named group, and a polite live region says the token's strongest weights in short."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    words = rep.texts[0].words
    animal, it = words.index("animal"), words.index("it")
    panel = page.locator("#bs-head-view .bs-panel[data-panel='0']")
    tree = panel.aria_snapshot()
    assert 'group "A: words attending (from)"' in tree and 'group "A: words attended to (to)"' in tree, tree
    left = panel.get_by_role("group", name="A: words attending (from)")
    right = panel.get_by_role("group", name="A: words attended to (to)")
    assert left.get_by_role("button", name=f"from “animal”, word {animal}", exact=True).count() == 1
    assert right.get_by_role("button", name=f"to “animal”, word {animal}", exact=True).count() == 1
    # a word without a counterpart in B says so in its name (it was in its tooltip only)
    assert left.get_by_role("button", name=re.compile(r"^from “tired”, word \d+, no counterpart in B$")).count() == 1
    live = page.locator("#bs-announce")
    assert live.get_attribute("aria-live") == "polite" and live.get_attribute("role") == "status"
    assert live.inner_text() == ""

    page.focus(f"#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-left[data-i='{it - 1}']")
    page.keyboard.press("ArrowDown")  # onto "it"
    page.wait_for_function("() => document.getElementById('bs-announce').textContent !== ''")
    said = live.inner_text()
    top = sorted(shown_values(page), key=lambda v: -v["value"])[:3]
    expected = "head 0: to " + ", ".join(f"“{words[v['to']]}” {v['text']:.3f}" for v in top)
    assert said == expected, (said, expected)  # the readout's three strongest, as it shows them
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.getElementById('bs-announce').textContent.startsWith('pinned')")
    assert live.inner_text() == f"pinned “it”, {expected}"
    # several heads: their mean, said as such (the table has a column each)
    page.click("#bs-heads-all")
    settle(page)
    page.focus(f"#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-right[data-i='{animal}']")
    page.wait_for_function("() => document.getElementById('bs-announce').textContent.startsWith('mean of 12 heads: from')")
    assert len(live.inner_text()) < 120, live.inner_text()  # a summary, not the table
    assert not errors, errors
    page.close()


def _marks(page, selector: str) -> list[tuple]:
    """How each element matching selector is drawn: its colours, borders and outline."""
    return [tuple(x) for x in page.eval_on_selector_all(selector, """els => els.map(e => {
        const c = getComputedStyle(e);
        return [c.backgroundColor, c.color, c.borderTopColor, c.borderTopStyle, c.outlineStyle,
                c.outlineColor, c.outlineWidth, c.boxShadow]; })""")]


def test_forced_colours_keep_the_selected_pressed_and_focused_marks(browser, compared):
    """In forced colours (Windows high contrast) the selected tab, the pressed head and A / B
    buttons and the focused token were drawn like the rest: their backgrounds were replaced by
    the system's one background."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    page.emulate_media(forced_colors="active")
    assert page.evaluate("() => matchMedia('(forced-colors: active)').matches")
    selected, = _marks(page, ".bs-tab[aria-selected='true']")
    assert selected not in _marks(page, ".bs-tab[aria-selected='false']")
    pressed, = _marks(page, ".bs-head[aria-pressed='true']")
    assert pressed not in _marks(page, ".bs-head[aria-pressed='false']")
    # the focused token (pointed at: no keyboard focus ring to tell it), and its counterpart in B
    page.hover("#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-left[data-i='2']")
    for p in (0, 1):
        focused, = _marks(page, f"#bs-head-view .bs-panel[data-panel='{p}'] .bs-tok.bs-left.bs-focus")
        rest = _marks(page, f"#bs-head-view .bs-panel[data-panel='{p}'] .bs-tok.bs-left:not(.bs-focus)")
        assert focused not in rest, (p, focused)
    page.click(".bs-tab[data-view='model']")
    settle(page)
    on, = _marks(page, "#bs-model-view .bs-segment button[aria-pressed='true']")
    assert on not in _marks(page, "#bs-model-view .bs-segment button[aria-pressed='false']")
    assert not errors, errors
    page.close()


CONTRAST_OF = """(e) => {
    // an element's text against what is behind it: its own background and each ancestor's, laid
    // over one another down to the first opaque one (white if none), a translucent shading
    // included; its colour, faded by its own and its ancestors' opacity, laid over that
    const rgba = (s) => { const v = s.match(/[\\d.]+/g).map(Number); return v.length > 3 ? v : [...v, 1]; };
    const over = (top, under) => under.map((u, i) => top[3] * top[i] + (1 - top[3]) * u);
    const lum = (c) => { const [r, g, b] = c.slice(0, 3).map((x) => x / 255).map((x) => x <= 0.03928
        ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
    let opacity = 1, opaque = false;
    const layers = [];
    for (let n = e; n; n = n.parentElement) {
        const c = getComputedStyle(n);
        opacity *= +c.opacity;
        const b = rgba(c.backgroundColor);
        if (!opaque && b[3] > 0) layers.push(b);
        opaque = opaque || b[3] >= 1;
    }
    let bg = [255, 255, 255];
    for (const c of layers.reverse()) bg = over(c, bg);
    const cs = getComputedStyle(e), f = rgba(cs.color);
    const fg = over([f[0], f[1], f[2], f[3] * opacity], bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    return { ratio: (hi + 0.05) / (lo + 0.05), color: cs.color, opacity,
             behind: `rgb(${bg.map(Math.round).join(", ")})` };
}"""


def _contrast(page, selector: str) -> float:
    """The contrast ratio of an element's text on what is behind it (:data:`CONTRAST_OF`)."""
    return page.eval_on_selector(selector, CONTRAST_OF)["ratio"]


def test_heads_that_do_not_apply_say_so_and_stay_readable(browser, compared):
    """With the mean over heads or the rollout shown, the head buttons went to opacity 0.25 (text
    unreadable) and a screen reader still heard the chosen one as pressed, and nothing more."""
    from playwright.sync_api import expect

    rep, path = compared
    page, errors = open_report(browser, rep, path)
    head0 = page.locator(".bs-head[data-head='0']")
    expect(head0).not_to_have_accessible_description(re.compile("not used"))
    for mode, what in (("mean", "the mean over heads"), ("rollout", "the rollout")):
        page.select_option("#bs-mode", mode)
        settle(page)
        expect(head0).to_have_accessible_description(f"not used: {what} is shown")
        assert page.is_visible("#bs-heads-unused")  # said to the eye too, beside the heads
        assert not page.is_disabled(".bs-head[data-head='3']")  # a click still shows that head
        for h in ("0", "3"):
            ratio = _contrast(page, f".bs-head[data-head='{h}']")
            assert ratio >= 4.5, (mode, h, ratio)
    page.click(".bs-head[data-head='3']")
    settle(page)
    assert page.input_value("#bs-mode") == "heads"
    expect(head0).not_to_have_accessible_description(re.compile("not used"))
    assert page.is_hidden("#bs-heads-unused")
    assert not errors, errors
    page.close()


def test_every_control_has_its_own_name(browser, compared):
    """The window's number boxes had no name, the heads were "0".."11", two buttons were both
    "all", and the A / B / A − B buttons were in no named group."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    controls = page.locator("#bs-controls")
    for name in ("sub-tokens from", "sub-tokens to (end excluded)"):
        assert controls.get_by_role("spinbutton", name=name, exact=True).count() == 1, name
    heads = controls.get_by_role("group", name="Heads", exact=True)
    assert [heads.get_by_role("button", name=f"head {h}", exact=True).count() for h in range(12)] == [1] * 12
    assert heads.get_by_role("button", name="all heads", exact=True).count() == 1
    assert controls.get_by_role("button", name="all sub-tokens", exact=True).count() == 1
    assert controls.get_by_role("button", name="all", exact=True).count() == 0
    page.click(".bs-tab[data-view='model']")
    settle(page)
    group = page.locator("#bs-model-view").get_by_role("group", name="text shown", exact=True)
    assert [group.get_by_role("button", name=n, exact=True).count() for n in ("A", "B", "A − B")] == [1, 1, 1]
    page.click(".bs-tab[data-view='qk']")
    settle(page)
    group = page.locator("#bs-qk-view").get_by_role("group", name="text shown", exact=True)
    assert [group.get_by_role("button", name=n, exact=True).count() for n in ("A", "B")] == [1, 1]
    assert not errors, errors
    page.close()


def test_escape_unpins_the_token_and_hides_the_tooltip(browser, compared):
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    col = "#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-left"
    page.focus(f"{col}[data-i='3']")
    page.keyboard.press("Enter")
    assert page.eval_on_selector_all(f"{col}[aria-pressed='true']", "els => els.map(e => e.dataset.i)") == ["3"]
    assert "pin=A.left.3" in page.url
    page.keyboard.press("Escape")
    assert page.locator("#bs-head-view .bs-tok.bs-pinned").count() == 0
    assert page.locator("#bs-head-view .bs-tok[aria-pressed='true']").count() == 0
    assert "pin=" not in page.url and page.inner_text("#bs-announce") == "unpinned"
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    matrix_readout(page, "0", 0.5, 0.5)  # the pointer on a cell: its tooltip
    assert page.is_visible("#bs-tip")
    page.keyboard.press("Escape")
    assert page.is_hidden("#bs-tip")
    assert not errors, errors
    page.close()


def test_a_pinned_token_keeps_its_outline_whole_and_its_focus_ring_apart(browser, compared):
    """The pin's outline replaced the focus ring (a focused pinned token looked like any pinned
    one) and was drawn outside the token, where the lines' scroll box cut off its left edge."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    col = "#bs-head-view .bs-panel[data-panel='0'] .bs-tok.bs-left"
    page.focus(f"{col}[data-i='0']")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowUp")  # the keyboard's focus on the first token, at the left edge
    page.keyboard.press("Enter")
    # the outline and shadow (the focused token's yellow is its own mark, pinned or not)
    ring = lambda m: m[4:]  # noqa: E731
    pinned_focused, = _marks(page, f"{col}.bs-pinned")
    page.keyboard.press("ArrowDown")
    pinned, = _marks(page, f"{col}.bs-pinned")
    focused, = _marks(page, f"{col}[data-i='1']")
    assert ring(pinned_focused) != ring(pinned) and ring(focused) != ring(pinned), (pinned_focused, pinned, focused)
    # the outline inside the token's box, and the box inside the scroll box (which cuts what is out)
    inside = page.eval_on_selector(f"{col}.bs-pinned", """e => {
        const c = getComputedStyle(e), r = e.getBoundingClientRect();
        const s = e.closest('.bs-hv-scroll').getBoundingClientRect();
        return [parseFloat(c.outlineOffset) + parseFloat(c.outlineWidth), r.left - s.left, r.top - s.top]; }""")
    assert inside[0] <= 0 and inside[1] >= 0 and inside[2] >= 0, inside
    assert not errors, errors
    page.close()


def test_a_comparison_names_both_texts_in_its_title(browser, compared):
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    title = page.title()
    assert "too tired" in title and "too wide" in title and len(title) <= 80, title
    assert not errors, errors
    page.close()


LONG = "the quick brown fox jumps over the lazy dog " * 22  # 198 words: [CLS] + 198 + [SEP]


@pytest.fixture(scope="module")
def long_report(bert, tmp_path_factory):
    """The saved report of a 200-word text: a zoomed matrix view scrolls both ways."""
    rep = build_report(bert, LONG.strip())
    return rep, rep.save(tmp_path_factory.mktemp("a11y_long") / "long.html")


_CURRENT_CELL = """n => {
    const p = document.querySelector("#bs-matrix-view .bs-panel[data-panel='0']");
    const c = p.querySelector("canvas.bs-grid"), s = p.querySelector(".bs-mscroll");
    const out = p.querySelector(".bs-mreadout");
    const lw = p.querySelector("canvas.bs-rowlabels").getBoundingClientRect().width;
    const r = c.getBoundingClientRect(), box = s.getBoundingClientRect(), cell = r.width / n;
    const x = r.left + +out.dataset.to * cell, y = r.top + +out.dataset.from * cell;
    // the part of the scroll box the label strips (stuck at its top and left) leave to the cells
    const left = box.left + s.clientLeft + lw, top = box.top + s.clientTop + lw;
    const right = box.left + s.clientLeft + s.clientWidth, bottom = box.top + s.clientTop + s.clientHeight;
    return {cell: [+out.dataset.from, +out.dataset.to], scroll: [s.scrollLeft, s.scrollTop],
            seen: x >= left - 0.5 && x + cell <= right + 0.5 && y >= top - 0.5 && y + cell <= bottom + 0.5,
            clip: {x: x - 3, y: y - 3, width: cell + 6, height: cell + 6}};
}"""


def test_the_heatmaps_current_cell_is_marked_and_kept_in_view(browser, long_report):
    """The arrow keys moved a current cell that only the readout below said: nothing marked it on
    the map, and on a zoomed map it went out of the scroll box, which did not follow it."""
    rep, path = long_report
    n = len(rep.texts[0].words)
    page, errors = open_report(browser, rep, path)
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    for _ in range(6):  # "+" six times: 2 px cells to 14
        before = page.evaluate("() => bertscope.state.zoom")
        page.click("#bs-matrix-view button[data-zoom='1']")
        page.wait_for_function(f"() => bertscope.state.zoom !== {'null' if before is None else before}")
        settle(page)
    assert page.evaluate("() => bertscope.state.zoom") == 14
    page.focus("#bs-matrix-view .bs-panel[data-panel='0'] canvas.bs-grid")
    for key, times in (("ArrowDown", 60), ("ArrowRight", 120)):  # past the box's bottom and right
        for _ in range(times):
            page.keyboard.press(key)
    at = page.evaluate(_CURRENT_CELL, n)
    assert at["cell"] == [60, 120] and at["seen"], at
    assert at["scroll"][0] > 0 and at["scroll"][1] > 0, at
    # in the window too, below the sticky controls bar
    box = at["clip"]
    bar = page.eval_on_selector("#bs-controls", "e => e.getBoundingClientRect().bottom")
    assert box["y"] + 3 >= bar and box["y"] + box["height"] - 3 <= 1000, (box, bar)
    # the cell is marked while the heatmap has the focus (and not once it has gone): a box drawn
    # round the cell, seen (read from the page, not from pixels, which a scroll would move)
    mark = ("() => { const m = document.querySelector(\"#bs-matrix-view .bs-panel[data-panel='0'] .bs-mcursor\"); "
            "return m.hidden || getComputedStyle(m).display === 'none' ? null : m.getBoundingClientRect().toJSON(); }")

    def marks_the_cell() -> bool:
        m, c = page.evaluate(mark), page.evaluate(_CURRENT_CELL, n)["clip"]  # the cell, 3 px round it
        return m is not None and m["x"] <= c["x"] + 3 and m["y"] <= c["y"] + 3 and \
            m["x"] + m["width"] >= c["x"] + c["width"] - 3 and m["y"] + m["height"] >= c["y"] + c["height"] - 3

    assert marks_the_cell()
    page.focus("#bs-matrix-view button[data-zoom='-1']")
    page.wait_for_function(f"() => ({mark})() === null", timeout=10_000)
    page.focus("#bs-matrix-view .bs-panel[data-panel='0'] canvas.bs-grid")
    page.wait_for_function(f"() => ({mark})() !== null", timeout=10_000)
    assert marks_the_cell()
    for key, times in (("ArrowUp", 55), ("ArrowLeft", 115)):  # back: the box scrolls up and left
        for _ in range(times):
            page.keyboard.press(key)
    at = page.evaluate(_CURRENT_CELL, n)
    assert at["cell"] == [5, 5] and at["seen"], at
    page.keyboard.press("End")  # the row's last column, at the far right
    at = page.evaluate(_CURRENT_CELL, n)
    assert at["cell"] == [5, n - 1] and at["seen"], at
    assert not errors, errors
    page.close()


def test_the_heatmaps_focus_ring_is_seen_whole(browser, compared):
    """The heatmap's focus ring was drawn round the map, inside its scroll box: the label strips
    covered it at the top and left, the box cut it off at the right and bottom."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    page.click(".bs-tab[data-view='matrix']")
    settle(page)
    page.focus("#bs-matrix-view .bs-panel[data-panel='0'] canvas.bs-grid")
    page.keyboard.press("ArrowRight")
    rings = page.eval_on_selector("#bs-matrix-view .bs-panel[data-panel='0'] canvas.bs-grid", """c => {
        const found = [];
        for (let e = c; e && !e.classList.contains('bs-view'); e = e.parentElement) {
            const s = getComputedStyle(e);
            if (s.outlineStyle === 'none' || !parseFloat(s.outlineWidth)) continue;
            const clippers = [];  // the boxes around it that cut off what is outside them
            for (let a = e.parentElement; a; a = a.parentElement) {
                const o = getComputedStyle(a);
                if (o.overflowX !== 'visible' || o.overflowY !== 'visible') clippers.push(a.className || a.tagName);
            }
            found.push({cls: e.className, offset: parseFloat(s.outlineOffset), clippers});
        }
        return found; }""")
    assert len(rings) == 1, rings
    ring, = rings
    assert ring["offset"] >= 0 and ring["clippers"] == [], ring  # outside the box, nothing cuts it
    assert not errors, errors
    page.close()


def _on(page) -> str:
    """The focused token, as "side index"."""
    return page.evaluate("() => { const a = document.activeElement; "
                         "return a.classList.contains('bs-tok') ? a.dataset.side + ' ' + a.dataset.i : a.tagName; }")


def test_token_columns_take_the_arrows_across_home_end_and_keep_their_tab_stop(browser, compared):
    """The head view's token columns took Up and Down only: Left and Right did not go across to
    the other column, Home and End did nothing, and Tab back into a column went to its first
    token, not the one the user had been on."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    col = "#bs-head-view .bs-panel[data-panel='0'] .bs-tok"
    page.focus(f"{col}.bs-left[data-i='0']")
    for _ in range(3):
        page.keyboard.press("ArrowDown")
    assert _on(page) == "left 3"
    page.keyboard.press("Tab")  # on to the other column (its first token: never visited)
    assert _on(page) == "right 0"
    page.keyboard.press("Shift+Tab")  # and back where the user was
    assert _on(page) == "left 3"
    page.keyboard.press("ArrowRight")  # across, the same token
    assert _on(page) == "right 3"
    page.keyboard.press("ArrowRight")  # no third column: it stays
    assert _on(page) == "right 3"
    page.keyboard.press("End")
    last = len(rep.texts[0].words) - 1
    assert _on(page) == f"right {last}"
    page.keyboard.press("ArrowLeft")
    assert _on(page) == f"left {last}"
    page.keyboard.press("Home")
    assert _on(page) == "left 0"
    page.keyboard.press("End")
    page.keyboard.press("Tab")
    assert _on(page) == f"right {last}"  # the right column's stop followed its last token focused
    # one tab stop a column, and a redraw (another layer) keeps where it is
    page.select_option("#bs-layer", "2")
    settle(page)
    stops = page.eval_on_selector_all(f"{col}[tabindex='0']", "els => els.map(e => e.dataset.side + ' ' + e.dataset.i)")
    assert stops == [f"left {last}", f"right {last}"], stops
    assert not errors, errors
    page.close()


def test_the_page_has_headings_and_every_part_is_in_a_landmark(browser, compared):
    """No h1 or h2 (only the panels' h3), the texts shown and the hint under the controls in no
    landmark, and the settings bar announced as navigation."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    assert page.get_by_role("heading", level=1).count() == 1
    for view, name in (("head", "Head view"), ("model", "Model view"), ("matrix", "Matrix view"),
                       ("qk", "Query–key view")):
        page.click(f".bs-tab[data-view='{view}']")
        settle(page)
        root = page.locator(f"#bs-{view}-view")
        h2 = root.get_by_role("heading", level=2)
        assert h2.count() == 1 and h2.inner_text() == name, view
        # the view's heading comes first, its panels' headings (if any) below it
        levels = page.eval_on_selector(f"#bs-{view}-view", "v => [...v.querySelectorAll('h1, h2, h3, h4, h5, h6')]"
                                       ".map(h => +h.tagName[1])")
        assert levels[0] == 2 and all(x == 3 for x in levels[1:]), (view, levels)
    for sel in ("#bs-texts", "#bs-hint", "#bs-controls", "#bs-head-view"):
        assert page.eval_on_selector(sel, "e => !!e.closest('main, header, footer, aside, nav, "
                                     "[role=main], [role=banner], [role=region]')"), sel
    assert page.get_by_role("navigation").count() == 0
    settings = page.get_by_role("region", name="settings", exact=True)
    assert settings.count() == 1
    assert settings.get_by_role("combobox", name="Layer").count() == 1
    assert settings.get_by_role("tab", name="Head view").count() == 1
    assert not errors, errors
    page.close()


def test_unpressed_head_buttons_are_readable_and_unlike_the_pressed(browser, compared):
    """An unpressed head button was drawn at opacity 0.55: its number at 3.65:1 on white."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    assert page.get_attribute(".bs-head[data-head='0']", "aria-pressed") == "true"
    for h in range(1, 12):
        ratio = _contrast(page, f".bs-head[data-head='{h}']")
        assert ratio >= 4.5, (h, ratio)
    pressed, = _marks(page, ".bs-head[aria-pressed='true']")
    unpressed = _marks(page, ".bs-head[aria-pressed='false']")
    assert all(u[:2] != pressed[:2] for u in unpressed)  # the colours tell them apart
    assert not errors, errors
    page.close()


CONTRAST = """e => {
    const c = (%s)(e);
    return { text: e.textContent, ratio: c.ratio, background: getComputedStyle(e).backgroundColor,
             classes: e.className, look: [getComputedStyle(e).color, getComputedStyle(e).fontStyle,
             getComputedStyle(e).fontWeight] };
}""" % CONTRAST_OF


def test_special_tokens_stay_readable_in_every_state_and_unlike_the_words(browser, tmp_path):
    """[CLS] and [SEP] were --muted grey (#667085): 4.97:1 on white, but 2.84:1 on the shading of
    the strongest weight and 4.14:1 on the focused token's yellow (axe: color-contrast). Made-up
    attention puts "a"'s whole weight on [CLS] and [SEP], half each: both take the strongest
    shading (the largest weight over itself, exactly 1: no rounding decides it)."""
    from bertscope import show

    tokens = ["[CLS]", "a", "b", "c", "[SEP]"]
    T = len(tokens)
    att = np.full((1, 1, T, T), 1.0 / T)  # (layers, heads, T, T)
    att[0, 0, 1] = [0.5, 0, 0, 0, 0.5]
    rep = show([torch.tensor(att[0])], tokens)
    page, errors = open_report(browser, rep, tmp_path / "special.html")
    col = "#bs-head-view .bs-panel[data-panel='0'] .bs-tok"
    special = [f"{col}.bs-{side}[data-i='{i}']" for side in ("left", "right") for i in (0, T - 1)]
    assert all(page.eval_on_selector(s, "e => e.classList.contains('bs-special')") for s in special)
    seen = []

    def check(state: str, selectors: list[str], marks: str = "") -> None:
        for sel in selectors:
            got = page.eval_on_selector(sel, CONTRAST)
            assert all(m in got["classes"].split() for m in marks.split()), (state, got)
            seen.append((state, got))
            assert got["ratio"] >= 4.5, (state, got)

    check("plain", special)
    word = page.eval_on_selector(f"{col}.bs-left[data-i='1']", CONTRAST)
    plain = page.eval_on_selector(special[0], CONTRAST)
    assert plain["look"] != word["look"], (plain, word)  # still unlike a word token
    page.hover(f"{col}.bs-left[data-i='1']")  # "a": the right column shaded by its weights
    shaded = [f"{col}.bs-right[data-i='0']", f"{col}.bs-right[data-i='{T - 1}']"]
    for sel in shaded:
        assert page.eval_on_selector(sel, "e => getComputedStyle(e).backgroundColor") == "rgba(36, 86, 201, 0.35)"
    check("shaded (the strongest weight)", shaded)
    shaded_word = page.eval_on_selector(f"{col}.bs-right[data-i='2']", CONTRAST)
    assert page.eval_on_selector(shaded[0], CONTRAST)["look"] != shaded_word["look"]
    page.hover(shaded[0])
    check("hovered", [shaded[0]], "bs-focus")
    page.click(shaded[1])  # pinned (and hovered)
    check("pinned, hovered", [shaded[1]], "bs-pinned bs-focus")
    page.hover(f"{col}.bs-left[data-i='1']")
    check("pinned, shaded", [shaded[1]], "bs-pinned")
    page.mouse.move(1, 1)  # off the lines: the pin is the focus
    check("pinned", [shaded[1]], "bs-pinned bs-focus")
    page.focus(f"{col}.bs-left[data-i='1']")
    page.keyboard.press("ArrowUp")  # the keyboard's focus, on the left [CLS]
    assert page.eval_on_selector(special[0], "e => e.matches(':focus-visible')")
    check("focused", [special[0]], "bs-focus")
    page.keyboard.press("Enter")
    check("focused, pinned", [special[0]], "bs-pinned bs-focus")
    print(*(f"{s}: {g['text']} {g['ratio']:.2f} on {g['background']}" for s, g in seen), sep="\n")
    assert not errors, errors
    page.close()


def test_query_key_bars_and_model_thumbnails_say_what_they_show(browser, compared):
    """The query-key view's bars and the model view's thumbnails were canvases with no text: a
    screen reader heard nothing of the query-key view's vectors and only the layer and head of a
    thumbnail. Each bar is now a picture named by its layer, head and vector and its 3 largest
    dimensions; each thumbnail keeps its name and says its 3 strongest weights."""
    from playwright.sync_api import expect

    from bertscope.core.words import word_attention

    rep, path = compared
    page, errors = open_report(browser, rep, path)
    layer, head = 3, 1
    show_head(page, layer, head, "qk")
    view = page.locator("#bs-qk-view")
    T = len(rep.texts[0].tokens)
    bars = view.locator("canvas")
    assert bars.count() == 3 * T + 2  # q, then k, q ⊙ k and weight · v for each key, the output
    named = view.get_by_role("img", name=re.compile(rf"^layer {layer}, head {head}, .+: \d+ dimensions, largest "))
    assert named.count() == bars.count()
    for i in range(bars.count()):
        expect(bars.nth(i)).to_have_role("img")
        expect(bars.nth(i)).to_have_accessible_name(re.compile(
            rf"^layer {layer}, head {head}, \S.*: \d+ dimensions, largest (dimension \d+ [+−]\d+\.\d{{3}}(, |$)){{3}}"))
    q = [float(x) for x in page.get_attribute("#bs-qk-query-vec", "data-values").split(",")]
    d = max(range(len(q)), key=lambda j: abs(q[j]))
    name = page.get_attribute("#bs-qk-query-vec canvas", "aria-label")
    said = re.search(r": (\d+) dimensions, largest dimension (\d+) ([+−])(\d+\.\d+)", name)
    assert said and [int(said.group(1)), int(said.group(2))] == [len(q), d], (name, d)
    value = float(said.group(4)) * (-1 if said.group(3) == "−" else 1)
    assert abs(value - q[d]) <= 5e-4 + 1e-9, (name, q[d])  # shown to 3 decimals

    page.click(".bs-tab[data-view='model']")
    settle(page)
    thumbs = page.locator("#bs-model-view canvas.bs-thumb")
    W = len(rep.texts[0].words)
    assert thumbs.count() == 6 * 14
    for i in range(thumbs.count()):
        x = thumbs.nth(i)
        l, h = x.get_attribute("data-layer"), x.get_attribute("data-head")
        own = (f"layer {l}, head {h}" if h.isdigit() else f"layer {l}, mean over heads" if h == "mean"
               else f"rollout through layer {l}")
        expect(x).to_have_role("button")  # it opens its map in the head view
        expect(x).to_have_accessible_name(own)
        expect(x).to_have_accessible_description(re.compile(
            rf"^{W} × {W} words; strongest: (“[^”]+” → “[^”]+” \d\.\d{{3}}(, |\. )){{3}}Enter opens it"))
    # the strongest weight said is the map's: layer 5, head 11
    thumb = page.locator("canvas.bs-thumb[data-layer='5'][data-head='11']")
    text = page.eval_on_selector("canvas.bs-thumb[data-layer='5'][data-head='11']",
                                 "e => document.getElementById(e.getAttribute('aria-describedby')).textContent")
    top = float(re.search(r"strongest: “[^”]+” → “[^”]+” (\d\.\d+)", text).group(1))
    words = word_attention(torch.from_numpy(rep.texts[0].attentions), rep.texts[0].token_words).numpy()
    assert abs(top - words[5, 11].max()) <= TEXT_TOL, (text, words[5, 11].max())
    expect(thumb).to_have_accessible_description(text)
    page.click(".bs-segment button[data-text='diff']")
    settle(page)
    expect(thumbs.first).to_have_accessible_description(re.compile(r"largest differences, A − B .*: “.+[+−]\d"))
    assert not errors, errors
    page.close()


EVERY_TEXT = """() => {
    // every text the eye is shown: each visible element with text of its own (or a select's or an
    // input's value), measured by CONTRAST_OF. A disabled control is left out (WCAG 1.4.3 exempts
    // inactive controls), as is the screen reader's text (out of sight) and a canvas (its pixels
    // are not text the DOM has)
    const contrastOf = %s;
    const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + [...e.classList].map((c) => "." + c).join("")
        + (e.dataset.head !== undefined ? `[data-head='${e.dataset.head}']` : "");
    const path = (e) => { const p = []; for (let n = e; n && n !== document.body && p.length < 3; n = n.parentElement) p.unshift(name(n));
        return p.join(" > "); };
    const out = [];
    for (const e of document.body.querySelectorAll("*")) {
        if (["SCRIPT", "STYLE", "CANVAS", "OPTION"].includes(e.tagName)) continue;
        const value = ["INPUT", "SELECT", "TEXTAREA"].includes(e.tagName) && e.type !== "checkbox" ? (e.value || "").trim() : "";
        if (!value && ![...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
        if (!e.checkVisibility({ visibilityProperty: true }) || e.closest(".bs-sr, :disabled")) continue;
        const box = e.getBoundingClientRect();
        if (box.width < 1 || box.height < 1) continue;
        const c = contrastOf(e), cs = getComputedStyle(e);
        const size = parseFloat(cs.fontSize), large = size >= 24 || (+cs.fontWeight >= 700 && size >= 18.66);
        out.push({ element: path(e), text: (value || e.textContent).trim().slice(0, 30), color: c.color,
                   opacity: c.opacity, background: c.behind, ratio: c.ratio, need: large ? 3 : 4.5 });
    }
    return out;
}""" % CONTRAST_OF


def test_every_text_on_the_page_meets_wcag_aa_contrast_in_every_view(browser, compared):
    """The muted text beyond the tokens was never measured. A pressed head button's white number
    on its head's colour and a readout column's head name in that colour were 2.35:1 to 3.09:1
    for heads 2, 4, 5, 7 and 10 (hsl(h, 68%, 44%): the greens, cyans and the orange are light).
    Every text shown, in every view and state, at 4.5:1 (3:1 large); a disabled control aside."""
    rep, path = compared
    page, errors = open_report(browser, rep, path)
    seen, failed = 0, {}

    def walk(state: str) -> None:
        nonlocal seen
        for t in page.evaluate(EVERY_TEXT):
            seen += 1
            if t["ratio"] < t["need"]:
                key = f"{t['element']} “{t['text']}” {t['color']} (opacity {t['opacity']:.2f}) on {t['background']}: " \
                      f"{t['ratio']:.2f}:1 < {t['need']}"
                failed.setdefault(key, []).append(state)

    walk("head view")
    click_token(page, 3)
    settle(page)
    walk("head view, a token pinned")
    for h in (2, 4, 5, 7, 10):
        page.click(f".bs-head[data-head='{h}']", modifiers=["Shift"])
        settle(page)
    walk("head view, 6 heads")
    page.click("#bs-heads-all")
    settle(page)
    walk("head view, all heads")
    for mode in ("mean", "rollout"):
        page.select_option("#bs-mode", mode)
        settle(page)
        walk(f"head view, {mode}")
    page.select_option("#bs-mode", "heads")
    settle(page)
    page.select_option("#bs-level", "token")
    settle(page)
    walk("head view, sub-tokens")
    for view in ("model", "matrix", "qk"):
        page.click(f".bs-tab[data-view='{view}']")
        settle(page)
        walk(f"{view} view")
        for i in range(page.locator(f"#bs-{view}-view .bs-segment button").count()):
            page.locator(f"#bs-{view}-view .bs-segment button").nth(i).click()  # the view is rebuilt
            settle(page)
            walk(f"{view} view, text {i}")
    assert seen > 200, seen
    assert not failed, "\n".join(f"{k}  [{', '.join(v[:3])}{'…' if len(v) > 3 else ''}]" for k, v in failed.items())
    assert not errors, errors
    page.close()
