"""The WSC reader, the held-out head choice, MAS, and the coref command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import bertscope
from bertscope.cli.app import main
from bertscope.understand.coref import evaluate, held_out_heads, hit, mas, rank_heads
from bertscope.errors import InputError
from bertscope.understand.wsc import parse_wsc, read_wsc, twin_groups

PRONOUNS = Path(bertscope.__file__).parent / "understand" / "data" / "pronouns.xml"


def _schema_xml(txt1, pron, txt2, a, b, correct):
    return (f"<schema>\n<text>\n<txt1>{txt1}</txt1>\n<pron>{pron}</pron>\n<txt2>{txt2}</txt2>\n</text>\n"
            f"<answers><answer>{a}</answer><answer>{b}</answer></answers>\n"
            f"<correctAnswer>{correct}</correctAnswer>\n<source>test</source>\n</schema>\n")


def test_reader_on_shipped_set():
    schemas, warns = read_wsc(PRONOUNS)
    assert warns == [] and len(schemas) == 12
    for s in schemas:
        assert s.text[slice(*s.pronoun_span)] == s.pronoun
        for cand, (a, b) in zip(s.candidates, s.candidate_spans):
            assert s.text[a:b].lower() == cand.lower()
    first = schemas[0]
    assert first.text == "The animal didn't cross the street because it was too tired."
    assert first.correct == 0 and schemas[1].correct == 1
    assert twin_groups(schemas) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_twins_with_another_candidate_are_one_group():
    """Twins were grouped by their candidates alone, so WSC's "a minnow" / "a shark" (swimming
    below "that duck") fell into two groups and could straddle the held-out split; now twins
    are also schemas that share at least half their words, and unrelated neighbours stay apart."""
    def schema(text: str, candidates: list[str]) -> str:
        return (f"<schema><text><txt1>{text}</txt1><pron>it</pron><txt2>.</txt2></text><quote><quote1></quote1>"
                f"<pron>it</pron><quote2></quote2></quote><answers>"
                + "".join(f"<answer>{c}</answer>" for c in candidates)
                + "</answers><correctAnswer>A</correctAnswer><source>test</source></schema>")
    xml = ("<collection>"
           + schema("Look! There is a minnow swimming right below that duck! It had better get away to safety fast",
                    ["a minnow", "that duck"])
           + schema("Look! There is a shark swimming right below that duck! It had better get away to safety fast",
                    ["a shark", "that duck"])
           + schema("The trophy doesn't fit into the brown suitcase because", ["the trophy", "the suitcase"])
           + schema("Pete envies Martin although", ["Pete", "Martin"])
           + "</collection>")
    schemas, warns = parse_wsc(xml.encode(), "twins.xml")
    assert warns == [] and len(schemas) == 4
    assert twin_groups(schemas) == [0, 0, 1, 2]


def test_reader_format_details():
    xml = ('<?xml version="1.0" encoding="ISO-8859-1"?>\n<collection>\n'
           + _schema_xml("\n  The caf\xe9 served the  guests because\n", " they ", " were hungry. \n",
                         " the guests ", "The café", " B. ")
           + "</collection>\n").encode("iso-8859-1")
    (s,), warns = parse_wsc(xml)
    assert warns == []
    assert s.text == "The caf\xe9 served the guests because they were hungry."
    assert s.correct == 1 and s.text[16:26] == "the guests" and s.candidate_spans[0] == (16, 26)


def test_bad_schemas_are_named_and_the_rest_is_read():
    xml = ("<collection>\n"
           + _schema_xml("Ann thanked Bea because", "she", "was kind.", "Ann", "Bea", "B")
           + "<schema><text><txt1>broken</txt2></text></schema>\n"
           + _schema_xml("Ann thanked Bea because", "she", "was kind.", "Ann", "Carla", "A")
           + _schema_xml("Ann thanked Bea because", "she", "was kind.", "Ann", "Bea", "Q")
           + _schema_xml("Cal called Dan because", "he", "was bored.", "Cal", "Dan", "A")
           + "</collection>").encode()
    schemas, warns = parse_wsc(xml, "t.xml")
    assert [s.number for s in schemas] == [1, 5]
    assert len(warns) == 3
    assert warns[0].startswith("schema 2 (line ") and "malformed XML" in warns[0]
    assert warns[1].startswith("schema 3") and "'Carla' is not in the text" in warns[1]
    assert warns[2].startswith("schema 4") and "correctAnswer" in warns[2]


def test_a_schema_whose_candidates_are_the_same_words_is_skipped():
    """"Bob" / "Bob" used to be scored: a tie on every head, counted 1/2 there and a win by the
    first and nearest baselines. Nested candidates ("Emma's" / "Emma's mother") stay two."""
    xml = ("<collection>\n"
           + _schema_xml("Bob met Bob because", "he", "was kind.", "Bob", "Bob", "A")
           + _schema_xml("Emma's mother told Ann that", "she", "was late.", "Emma's", "Emma's mother", "B")
           + "</collection>").encode()
    schemas, warns = parse_wsc(xml, "t.xml")
    assert [s.number for s in schemas] == [2]
    assert len(warns) == 1 and "'Bob' and 'Bob' are the same words of the text" in warns[0]


def test_reader_refuses_dtd_and_non_wsc():
    with pytest.raises(InputError, match="DTD"):
        parse_wsc(b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><collection></collection>')
    with pytest.raises(InputError, match="no <schema>"):
        parse_wsc(b"<collection><item/></collection>")
    with pytest.raises(InputError, match="does not exist"):
        read_wsc("/nonexistent/file.xml")


def test_a_utf16_or_utf32_file_is_read_by_its_byte_order_mark_and_its_dtd_still_refused():
    """A UTF-16 file (legal XML, encoding="UTF-16" declared) was read as UTF-8 and refused with
    Python's codec message; a DTD inside it escaped the byte search for <!DOCTYPE."""
    xml = ('<?xml version="1.0" encoding="{enc}"?>\n<collection>\n'
           + _schema_xml("The trophy does not fit in the suitcase because", "it", "is too big.", "trophy", "suitcase", "A")
           + "</collection>\n")
    plain, _ = parse_wsc(xml.format(enc="UTF-8").encode("utf-8"), "t.xml")
    for enc in ("UTF-16", "UTF-32", "UTF-8"):
        codec = "utf-8-sig" if enc == "UTF-8" else enc.lower()  # each with its byte-order mark
        schemas, warns = parse_wsc(xml.format(enc=enc).encode(codec), "t.xml")
        assert schemas == plain and not warns, enc
    with pytest.raises(InputError, match="declares a DTD"):
        parse_wsc('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><collection></collection>'.encode("utf-16"))
    with pytest.raises(InputError, match=r"is not readable as x-no-such-codec \(.*\); save it as UTF-8$"):
        parse_wsc(b'<?xml version="1.0" encoding="x-no-such-codec"?><collection></collection>', "t.xml")


def test_hit_and_mas_by_hand():
    assert float(hit(torch.tensor([0.3, 0.1]), 0)) == 1.0
    assert float(hit(torch.tensor([0.3, 0.1]), 1)) == 0.0
    assert float(hit(torch.tensor([0.2, 0.2]), 1)) == 0.5
    # one layer, two heads: head 0 prefers candidate 0 (0.3), head 1 prefers candidate 1 (0.25)
    a = torch.tensor([[[0.3, 0.1], [0.2, 0.25]]])  # (N=1, H=2, K=2)
    m = mas(a)
    assert m.tolist() == pytest.approx([0.3 / 0.55, 0.25 / 0.55])


def test_held_out_never_scores_what_it_chose_on():
    S, N, H = 8, 2, 3
    folds = [0, 0, 0, 0, 1, 1, 1, 1]
    numbers = [10, 11, 12, 13, 20, 21, 22, 23]
    hits = torch.zeros(S, N, H)
    hits[:4, 0, 0] = 1  # head (0,0) perfect on fold 0, useless on fold 1
    hits[4:, 1, 2] = 1  # head (1,2) perfect on fold 1, useless on fold 0
    res = held_out_heads(hits, folds, numbers)
    assert len(res) == 2
    for f in res:
        assert set(f.chosen_on).isdisjoint(f.scored_on)
        assert set(f.chosen_on) | set(f.scored_on) == set(numbers)
        assert f.choice_accuracy == 1.0 and f.test_accuracy == 0.0  # scored only on unseen schemas
    assert {(f.layer, f.head) for f in res} == {(0, 0), (1, 2)}
    assert {f.scored_on for f in res} == {(10, 11, 12, 13), (20, 21, 22, 23)}


def test_evaluate_on_shipped_set(bert):
    schemas, _ = read_wsc(PRONOUNS)
    res = evaluate(bert, schemas)
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    assert len(res.numbers) == 12 and res.head_accuracy.shape == (N, H)
    scored = [n for f in res.held_out for n in f.scored_on]
    assert sorted(scored) == sorted(res.numbers)  # every schema scored exactly once, held out
    groups = dict(zip(res.numbers, twin_groups(schemas)))
    for f in res.held_out:  # twins never straddle the split
        assert {groups[n] for n in f.chosen_on}.isdisjoint({groups[n] for n in f.scored_on})
    for x in (res.mas_accuracy, res.first_accuracy, res.nearest_accuracy, res.held_out_accuracy):
        assert 0.0 <= x <= 1.0
    assert res.chance == 0.5


def test_evaluate_and_parse_wsc_check_what_they_are_given(bert):
    """These raised TypeError or AttributeError from inside (a path for the schemas, a str for
    parse_wsc, limit="3"), took limit=True as 1, or hid a bare BertModel behind "no schema
    could be scored"."""
    schemas, _ = read_wsc(PRONOUNS)
    for call, fragment in (
            (lambda: evaluate(bert, str(PRONOUNS)), "schemas must be a list of Schema, as read_wsc(path)"),
            (lambda: evaluate(bert, schemas, limit="3"), "limit must be a whole number >= 1, got '3'"),
            (lambda: evaluate(bert, schemas, limit=True), "limit must be a whole number >= 1, got True"),
            (lambda: evaluate(bert, schemas, limit=2.5), "limit must be a whole number >= 1, got 2.5"),
            (lambda: evaluate(bert, schemas, progress=1), "progress must be a function"),
            (lambda: evaluate(bert.model, schemas), "evaluate() takes a loaded model, bertscope.load(...), not BertModel"),
            (lambda: evaluate(bert, schemas[6:], limit=4), "no schema could be scored (none given is numbered 1..4"),
            # the reader's reason comes first: schemas 1..limit may have been unreadable
            (lambda: evaluate(bert, schemas[6:], limit=4, warnings=["schema 1 (line 2): malformed XML; skipped"]),
             "no schema could be scored (schema 1 (line 2): malformed XML; skipped)"),
            (lambda: parse_wsc(PRONOUNS.read_text()), "parse_wsc() reads the file's bytes")):
        with pytest.raises(InputError, match=re.escape(fragment)):
            call()
    assert evaluate(bert, schemas, limit=4).numbers == [s.number for s in schemas if s.number <= 4]


def test_coref_cli(tmp_path, capsys):
    assert main(["coref", str(PRONOUNS)]) == 0
    out = capsys.readouterr().out
    assert "MAS" in out and "held out" in out and "nearest candidate" in out
    bad = tmp_path / "bad.xml"
    bad.write_text("<collection>"
                   + _schema_xml("The cat chased the dog because", "it", "was hungry.", "The cat", "the dog", "A")
                   + _schema_xml("The cat chased the dog because", "it", "was fast.", "The cow", "the dog", "B")
                   + "<schema><answers></schema>" + "</collection>")
    assert main(["coref", str(bad), "--json"]) == 0
    cap = capsys.readouterr()
    assert _strict_loads(cap.out)["schemas_scored"] == 1
    assert "schema 2 (line" in cap.err and "'The cow'" in cap.err and "schema 3" in cap.err
    notxml = tmp_path / "n.xml"
    notxml.write_text("hello")
    assert main(["coref", str(notxml)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no <schema>" in err


def test_limit_counts_only_the_schemas_it_keeps(tmp_path, capsys):
    """--limit 1 on a file whose schemas 2-4 are unusable said "1 schema scored, 3 skipped" and
    warned about schemas the limit had left out: a bad schema past 273 would have made WSC273
    read as "273 scored, 1 skipped". Schemas past the limit are neither scored nor skipped."""
    wsc = tmp_path / "w.xml"
    wsc.write_text("<collection>\n"
                   + _schema_xml("The cat chased the dog because", "it", "was hungry.", "The cat", "the dog", "A")
                   + "<schema><text><txt1>broken</txt2></text></schema>\n"
                   + _schema_xml("The cat chased the dog because", "it", "was fast.", "The cow", "the dog", "B")
                   + _schema_xml("The cat chased the dog because", "it", "was slow.", "The cat", "the dog", "Q")
                   + "</collection>")
    assert main(["coref", str(wsc), "--limit", "1", "--quiet"]) == 0
    cap = capsys.readouterr()
    assert "1 schema scored\n" in cap.out and "skipped" not in cap.out and "warning" not in cap.err
    assert main(["coref", str(wsc), "--limit", "3", "--quiet", "--json"]) == 0
    cap = capsys.readouterr()
    warns = _strict_loads(cap.out)["warnings"]
    assert [w.split(" (line")[0] for w in warns] == ["schema 2", "schema 3"], warns
    assert main(["coref", str(wsc), "--quiet"]) == 0
    assert "1 schema scored, 3 skipped" in capsys.readouterr().out


def test_an_unclosed_schema_keeps_its_place_in_the_numbering_and_the_limit(tmp_path, capsys):
    """An unclosed <schema> was not numbered, so every later schema's number moved down by one
    (--limit 273 took in the file's 274th), and its warning counted under any --limit."""
    good = _schema_xml("The cat chased the dog because", "it", "was hungry.", "The cat", "the dog", "A")
    wsc = tmp_path / "w.xml"
    wsc.write_text("<collection>\n" + good + good + "<schema><text>cut off\n" + good + "</collection>")
    schemas, warns = read_wsc(wsc)
    assert [s.number for s in schemas] == [1, 2, 4]
    assert len(warns) == 1 and warns[0].number == 3 and "(the first: schema 3, line 22)" in warns[0]  # after two 10-line schemas
    assert main(["coref", str(wsc), "--limit", "2", "--quiet"]) == 0
    assert "2 schemas scored\n" in capsys.readouterr().out
    assert main(["coref", str(wsc), "--limit", "3", "--quiet"]) == 0
    assert "2 schemas scored, 1 skipped" in capsys.readouterr().out


def test_a_file_with_no_usable_schema_counts_only_those_within_the_limit(tmp_path, capsys):
    bad = tmp_path / "bad.xml"
    bad.write_text("<collection>" + "".join(
        _schema_xml("Ann met Bea because", "she", "was kind.", "Ann", f"Cy{i}", "A") for i in range(3))
        + "</collection>")
    assert main(["coref", str(bad), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "schema 2" not in err and "schema 3" not in err
    assert err.strip().splitlines()[-1].endswith("no usable schema (1 skipped)"), err


def test_coref_says_when_its_noise_band_is_too_wide_to_tell_a_score_from_chance(tmp_path, capsys):
    """--limit 1 printed 100% next to "+/- 98.0 points" and nothing more. Under a band wider
    than 10 points a note says so, and how many schemas narrow it to 10: the n where
    1.96 x sqrt(0.25 / n) <= 0.10, i.e. 97. At 97 schemas it is gone."""
    rows = "".join(_schema_xml(f"Sam thanked Kim number {i} because", "she", "had helped.", "Sam", "Kim", "B")
                   for i in range(97))
    wsc = tmp_path / "many.xml"
    wsc.write_text(f"<collection>{rows}</collection>")
    assert main(["coref", str(wsc), "--limit", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert ("  note: with 1 schema, a score within +/- 98.0 points of chance may be noise;\n"
            "        97 or more schemas narrow that to +/- 10 points\n") in out, out
    assert main(["coref", str(wsc), "--limit", "96", "--quiet"]) == 0
    assert "with 96 schemas" in capsys.readouterr().out  # 1.96 x sqrt(0.25 / 96) = 0.1000... > 0.10
    assert main(["coref", str(wsc), "--quiet"]) == 0
    assert "note:" not in capsys.readouterr().out


def _strict_loads(text: str):
    """json.loads that rejects NaN and Infinity (Python's json accepts them; JSON does not)."""
    def refuse(const):
        raise ValueError(f"{const} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_one_twin_group_gives_null_held_out_not_nan(capsys):
    # the shipped set's first two schemas are twins: one group, so no other half to choose a head on
    assert main(["coref", str(PRONOUNS), "--limit", "2", "--json"]) == 0
    held = _strict_loads(capsys.readouterr().out)["held_out"]
    assert held["accuracy"] is None and held["folds"] == [] and "two twin groups" in held["note"]
    assert main(["coref", str(PRONOUNS), "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower() and "needs at least two twin groups" in out


def test_coref_json_is_strict(capsys):
    assert main(["coref", str(PRONOUNS), "--json"]) == 0
    d = _strict_loads(capsys.readouterr().out)
    assert 0.0 <= d["held_out"]["accuracy"] <= 1.0 and "note" not in d["held_out"]


def test_strict_json_refuses_nan():
    from bertscope.cli.guard import dumps_strict

    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError):
            dumps_strict({"accuracy": bad})


def test_coref_top_zero_is_refused(capsys):
    assert main(["coref", str(PRONOUNS), "--top", "0"]) == 2
    err = capsys.readouterr().err
    assert "--top must be at least 1" in err and len(err.strip().splitlines()) == 1


def test_rank_heads_breaks_ties_by_position():
    acc = torch.tensor([[0.25, 0.75, 0.5], [0.75, 0.0, 0.75]])
    assert [(l, h) for l, h, _ in rank_heads(acc)] == [(0, 1), (1, 0), (1, 2), (0, 2), (0, 0), (1, 1)]
    assert rank_heads(torch.zeros(2, 3))[0][:2] == (0, 0)


def test_best_head_is_the_first_head_listed(capsys):
    # one schema: every head scores 0, 1/2 or 1, so there are many ties at the top
    assert main(["coref", str(PRONOUNS), "--limit", "1", "--top", "3"]) == 0
    out = capsys.readouterr().out
    best = re.search(r"best head in sample.*?(L\d+ H\d+), chosen", out).group(1)
    listed = out.split("in sample; ties")[1].splitlines()[1].split()
    assert f"{listed[0]} {listed[1]}" == best
    assert main(["coref", str(PRONOUNS), "--limit", "1", "--json"]) == 0
    d = _strict_loads(capsys.readouterr().out)
    acc = torch.tensor(d["head_accuracy"])
    b = d["best_head_in_sample"]
    assert (b["layer"], b["head"]) == rank_heads(acc)[0][:2]
    assert b["accuracy"] == pytest.approx(float(acc.max()))


def test_the_nearest_baseline_scores_a_tie_as_the_heads_do():
    """Two candidates as near the pronoun ("Bob, he, Tim": two characters each side) score 1/2,
    as a tie between heads' scores does; the nearest candidate alone scores 1."""
    from bertscope.understand.coref import SchemaScores

    xml = ("<collection>\n" + _schema_xml("Bob,", "he", ", Tim.", "Bob", "Tim", "B")
           + _schema_xml("Bob saw Tim,", "he", "said.", "Bob", "Tim", "B") + "</collection>").encode()
    (tie, near), warns = parse_wsc(xml, "t.xml")
    assert warns == []
    none = torch.zeros(1, 1, 2)
    scored = SchemaScores(tie, none, none)
    assert scored.gaps() == [2, 2] and scored.nearest() == 0 and scored.nearest_hit() == 0.5
    scored = SchemaScores(near, none, none)
    assert scored.nearest() == 1 and scored.nearest_hit() == 1.0


def test_a_cjk_candidate_is_found_without_spaces_around_it():
    """猫 in 猫が犬を追いかけた was reported "not in the text": the candidate had to stand between
    word boundaries, which CJK text has none of. Latin candidates still match whole words only."""
    xml = ("<collection>\n" + _schema_xml("猫が犬を追いかけた。なぜなら", "それ", "は速かったから。", "猫", "犬", "A")
           + _schema_xml("The cat met Cathy because", "she", "was kind.", "Cat", "Cathy", "B") + "</collection>").encode()
    schemas, warns = parse_wsc(xml, "t.xml")
    assert warns == [] and [s.number for s in schemas] == [1, 2]
    cjk, latin = schemas
    assert [cjk.text[a:b] for a, b in cjk.candidate_spans] == ["猫", "犬"]
    assert [latin.text[a:b] for a, b in latin.candidate_spans] == ["cat", "Cathy"]  # not "Cat" of "Cathy"
