"""Ablation: silencing a head equals removing its slice of W_O in HF's model; sweep and CLI."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertscope.core.words import group_words
from bertscope.understand.ablate import ablate, sweep
from bertscope.cli.app import main
from bertscope.errors import InputError

from conftest import IT_ANIMAL


def test_silenced_head_matches_hf_with_its_w_o_columns_zeroed(bert, hf_model):
    layer, head = 3, 1
    D = bert.config.head_size
    res = ablate(bert, IT_ANIMAL, [(layer, head)])
    hf = copy.deepcopy(hf_model)
    with torch.no_grad():  # the head's context enters W_O through columns head*D .. head*D + D
        hf.encoder.layer[layer].attention.output.dense.weight[:, head * D:(head + 1) * D] = 0
    batch = bert.encode([IT_ANIMAL])
    with torch.inference_mode():
        ref_cut = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        ref = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    expected = F.cosine_similarity(ref[0], ref_cut[0], dim=-1)
    torch.testing.assert_close(res.token_cosine, expected, atol=1e-5, rtol=1e-5)
    assert float(res.token_cosine.min()) < 0.9999  # the head did something


def test_embedding_effect_of_a_long_text_is_on_what_sentence_transformers_embeds(bert, bundled_path):
    """The sentence embedding pooled every token up to 512, where the model's own embedding
    (sentence-transformers, bert.embed) cuts at 256: for a 352-token text the cosine was another.
    The reference: sentence-transformers, with the head's columns of W_O zeroed."""
    from sentence_transformers import SentenceTransformer

    text = " ".join(["The animal didn't cross the street because it was too tired."] * 22)
    assert len(bert.encode([text]).tokens[0]) > 300 > bert.max_seq_length == 256
    layer, head = 5, 11
    D = bert.config.head_size
    st = SentenceTransformer(str(bundled_path), device="cpu")
    intact = st.encode([text], convert_to_tensor=True)[0]
    with torch.no_grad():
        st[0].auto_model.encoder.layer[layer].attention.output.dense.weight[:, head * D:(head + 1) * D] = 0
    silenced = st.encode([text], convert_to_tensor=True)[0]
    expected = float(F.cosine_similarity(intact, silenced, dim=0))
    assert expected < 0.999  # the head matters here
    assert ablate(bert, text, [(layer, head)]).embedding_cosine == pytest.approx(expected, abs=2e-5)


def test_word_shift_only_downstream(bert):
    res = ablate(bert, IT_ANIMAL, [(3, 1)], word="it")
    assert res.word_shift is not None
    assert float(res.word_shift[:4].abs().max()) < 1e-6  # its own layer and those before: unchanged
    assert float(res.word_shift[4:].max()) > 0
    assert bool(((res.word_shift >= 0) & (res.word_shift <= 1 + 1e-6)).all())


def test_sweep_agrees_with_single_ablation(bert):
    text = "The cat sat."
    eff = sweep(bert, text)
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    assert eff.token_effect.shape == (N, H)
    ranked = eff.ranking()
    assert [r[2] for r in ranked] == sorted((r[2] for r in ranked), reverse=True)
    l, h = ranked[0][:2]
    one = ablate(bert, text, [(l, h)])
    assert 1 - float(one.token_cosine.mean()) == pytest.approx(ranked[0][2], abs=1e-5)
    assert eff.ranking(3) == ranked[:3]
    for k in (-1, 0, "2", 2.5):  # -1 dropped the last head without a word; "2" raised TypeError
        with pytest.raises(InputError, match="k must be a whole number >= 1"):
            eff.ranking(k)


def test_ablate_bad_input(bert):
    with pytest.raises(InputError, match="does not exist"):
        ablate(bert, "The cat sat.", [(99, 0)])
    with pytest.raises(InputError, match=r"at least one head .*\(bertscope\.understand\.ablate\.sweep\(bert, text\)"):
        ablate(bert, "The cat sat.", [])  # it named a sweep() that bertscope does not export


def test_ablate_cli(capsys):
    assert main(["ablate", IT_ANIMAL, "--layer", "3", "--head", "1", "--token", "it"]) == 0
    out = capsys.readouterr().out
    assert "embedding cosine" in out and "L5:" in out
    assert main(["ablate", "The cat sat.", "--layer", "0", "--head", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["heads"] == [[0, 1]]
    assert main(["ablate", "The cat sat.", "--layer", "0"]) == 2
    err = capsys.readouterr().err
    assert "pairs" in err and len(err.strip().splitlines()) == 1
    assert main(["ablate", "The cat sat.", "--layer", "0", "--head", "40"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_ablate_takes_the_occurrence_of_the_word_and_says_which(bert, capsys):
    """ablate --token took the first occurrence only, and did not say which word it had used."""
    text = "The cat saw the dog and the dog ran."
    args = ["ablate", text, "--layer", "2", "--head", "3", "--token", "dog"]
    assert main([*args, "--occurrence", "2", "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert main([*args, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    words = group_words(bert.encode([text]), text).words
    assert words[first["word_index"]] == words[second["word_index"]] == "dog"
    assert second["word_index"] == words.index("dog", first["word_index"] + 1)
    direct = ablate(bert, text, [(2, 3)], "dog", occurrence=2)  # the library's own answer
    assert direct.word_index == second["word_index"]
    np.testing.assert_allclose(second["word_shift"], direct.word_shift.numpy(), atol=1e-6)
    assert first["word_shift"] != second["word_shift"]
    assert main([*args, "--occurrence", "2"]) == 0
    assert f'how "dog" (word {second["word_index"]})' in capsys.readouterr().out
    assert main([*args, "--occurrence", "3"]) == 2
    assert "the word 'dog' occurs 2 times; occurrence 3 does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("args, fragment", [
    (["--sweep", "--token", "dog"], "use one or the other"),  # --token used to be ignored by --sweep
    (["--layer", "0", "--head", "1", "--top", "3"], "--top is for --sweep"),  # and --top without it
    (["--layer", "0", "--head", "1", "--occurrence", "2"], "--occurrence picks which occurrence of --token WORD"),
    # neither: the library's words, "heads=[(layer, head)]; in the CLI --layer L --head H", were shown
    ([], "bertscope: error: name a head to silence with --layer L --head H (repeat both for more), or give --sweep"),
])
def test_ablate_refuses_flags_it_would_ignore(args, fragment, capsys):
    assert main(["ablate", "The cat sat.", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_sweep_json_ranking_follows_top(capsys):
    assert main(["ablate", "The cat sat.", "--sweep", "--top", "2", "--json", "--quiet"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["ranking"]) == 2 and len(data["token_effect"][0]) == 12  # the matrices stay whole


def test_sweep_ranks_equal_effects_in_layer_then_head_order():
    """argsort without stable=True left the order of equal effects to the sort's internals."""
    from bertscope.understand.ablate import HeadEffects

    effect = torch.zeros(3, 40)  # more than the few elements an unstable sort keeps in order
    effect[2, 5] = effect[0, 7] = 0.5
    eff = HeadEffects(text="t", token_effect=effect, embedding_effect=effect.clone())
    ranked = [(l, h) for l, h, _, _ in eff.ranking()]
    assert ranked[:2] == [(0, 7), (2, 5)]
    assert ranked[2:] == [(l, h) for l in range(3) for h in range(40) if (l, h) not in ((0, 7), (2, 5))]


def test_ablate_json_word_index_points_into_its_own_words(capsys, bert):
    """word_index pointed into a list of words the JSON did not hold; the words are attend's."""
    assert main(["ablate", IT_ANIMAL, "--layer", "3", "--head", "1", "--token", "it", "--occurrence", "1",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["words"][data["word_index"]] == "it"
    assert data["words"] == bertscope_words(bert)


def bertscope_words(bert) -> list[str]:
    import bertscope

    return bertscope.attend(bert, IT_ANIMAL, "it").words
