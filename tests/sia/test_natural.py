"""The natural-conversation memory set: its files load and hold what the issue asks of them, the two parts share no
name or place, a reply is scored on the newest value, and the batched player asks every user at every depth."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from sia.backbones.llama import LlamaModel
from sia.learn.natural import MAIN_KINDS, NaturalUser, answered, load_fillers, load_users, recall_by_depth
from sia.model.config import LlamaConfig
from sia.model.tokenizer import ByteTokenizer


def test_the_set_has_its_parts_and_their_sizes() -> None:
    tune, held = load_users("tune"), load_users("heldout")
    assert len(tune) == 60 and len(held) == 120
    assert len(load_fillers("tune")) == 80 and len(load_fillers("heldout")) == 120
    for users in (tune, held):
        kinds = [q.kind for u in users for q in u.questions]
        for kind in MAIN_KINDS:
            assert kinds.count(kind) >= len(users) * 2 // 5, kind
        assert sum(any(f.corrects for f in u.facts) for u in users) >= len(users) // 6
    assert not {u.id for u in tune} & {u.id for u in held}
    train = load_users("train")  # what training may read, written apart in the same manner
    assert len(train) == 240 and not {u.id for u in train} & {u.id for u in (*tune, *held)}
    assert sum(q.kind in MAIN_KINDS for u in train for q in u.questions) >= 700
    with pytest.raises(ValueError, match="parts"):
        load_users("everything")


def test_the_parts_share_no_name_or_place_and_no_filler() -> None:
    def open_values(users: list[NaturalUser]) -> set[str]:
        kinds = ("name", "city", "origin", "relative", "pet_name")
        return {a.lower() for u in users for f in u.facts if f.kind in kinds for a in f.accept}

    tune, held, train = (open_values(load_users(part)) for part in ("tune", "heldout", "train"))
    assert not tune & held and not train & held and not train & tune
    assert not set(load_fillers("tune")) & set(load_fillers("heldout"))


def test_training_phrases_avoid_the_held_out_names_and_places() -> None:
    values = json.loads((Path(__file__).parents[2] / "sia/learn/data/read_values.json").read_text())
    trained = {v.lower() for kind in ("name", "city", "origin") for v in values[kind]}
    held = {f.value.lower() for u in load_users("heldout") for f in u.facts if f.kind in ("name", "city", "origin")}
    assert not trained & held


def _user(facts: list[dict[str, object]]) -> NaturalUser:
    from sia.learn.natural import _user as parse

    kinds = sorted({str(f["kind"]) for f in facts})
    row = {"id": "x1", "messages": ["I'm Ana and I live in Porto. Actually we moved to Braga."], "facts": facts,
           "questions": [{"kind": k, "text": "?"} for k in kinds]}  # fmt: skip
    return parse(row, "test")


def test_a_reply_is_scored_on_the_newest_value() -> None:
    user = _user(
        [
            {"kind": "name", "value": "Ana", "accept": ["Ana"], "message": 0, "clause": "I'm Ana"},
            {"kind": "city", "value": "Porto", "accept": ["Porto"], "message": 0, "clause": "I live in Porto"},
            {
                "kind": "city",
                "value": "Braga",
                "accept": ["Braga"],
                "message": 0,
                "clause": "we moved to Braga",
                "corrects": "Porto",
            },
        ]
    )
    assert answered("You live in Braga now.", user, "city")
    assert not answered("You live in Porto.", user, "city")
    assert not answered("Porto or Braga?", user, "city")  # the older value given too
    assert answered("Hello ana!", user, "name") and not answered("Banana bread", user, "name")
    # an older value inside the newest one's words is not given ("Jess", then "I prefer Jessamyn")
    jess = _user(
        [
            {"kind": "name", "value": "Jess", "accept": ["Jess"], "message": 0, "clause": "I'm Ana"},
            {"kind": "name", "value": "Jessamyn", "accept": ["Jessamyn"], "message": 0, "clause": "I'm Ana", "corrects": "Jess"},
        ]
    )
    assert answered("Jessamyn, if I remember correctly.", jess, "name")
    assert not answered("Jess or Jessamyn?", jess, "name") and not answered("Jess.", jess, "name")


def test_a_user_whose_clause_is_not_in_the_message_is_refused() -> None:
    with pytest.raises(ValueError, match="clause"):
        _user([{"kind": "name", "value": "Ana", "accept": ["Ana"], "message": 0, "clause": "my name is Ana"}])
    with pytest.raises(ValueError, match="unknown kind"):
        _user([{"kind": "shoe", "value": "Ana", "accept": ["Ana"], "message": 0, "clause": "I'm Ana"}])


def _tiny() -> LlamaModel:
    hf = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    config = LlamaConfig.from_hf(hf, d_self=8, trace_layers=[0], imprint_tokens=16, imprint_min_shock=0.0)
    model = LlamaModel(config, ByteTokenizer()).eval()
    model.load_base(LlamaForCausalLM(HFLlamaConfig(**hf)).eval().state_dict())
    return model


def test_recall_by_depth_asks_every_user_at_every_depth() -> None:
    model = _tiny()
    users = load_users("tune")[:2]
    fillers = ["hi?", "ok."]
    from sia.model.generate import SamplingParams

    short = SamplingParams(max_new_tokens=2, temperature=0)
    results = recall_by_depth(model, model.tokenizer, users, fillers, [0, 2], system=list(b"sys "), talk=short, ask=short)
    assert [r.depth for r in results] == [0, 2]
    for r in results:
        assert set(r.right) == {u.id for u in users}
        assert all(set(r.right[u.id]) == {q.kind for q in u.questions} for u in users)
        assert 0.0 <= r.per_fact <= 1.0
    oracle = recall_by_depth(model, model.tokenizer, users, fillers, [0, 2], system=[], mode="oracle", talk=short, ask=short)
    assert len(oracle) == 1
    with pytest.raises(ValueError, match="ascending"):
        recall_by_depth(model, model.tokenizer, users, fillers, [2, 0], system=[])


def test_kept_tells_whether_the_asked_value_is_among_the_imprinted_words() -> None:
    """The write's share of a question: the newest value in the imprint's words (None with no text kept)."""
    from dataclasses import replace

    from sia.identity.imprint import Imprint, SpanChoice, imprint_spans
    from sia.identity.state import IdentityState
    from sia.learn.natural import Fact, Question, kept

    model = _tiny()
    tok = model.tokenizer
    message = "I live in Oslo."  # 15 tokens: the tiny imprint holds 16
    ids = torch.tensor(tok.encode(message), dtype=torch.int32)
    n, (layers, heads, _, d) = len(ids), model.config.imprint_shape
    keys = torch.randn(layers, heads, n, d)
    fact = Fact("city", "Oslo", ("Oslo",), 0, message)
    user = NaturalUser("u", (message,), (fact,), (Question("city", "Where do I live?"),))
    state = IdentityState.fresh(model.config)
    assert kept(state, tok, user, "city") is None  # no imprint yet
    whole = imprint_spans(Imprint.empty(model.config), keys, keys, [SpanChoice(0, n, 5.0)], turn=0, tokens=ids)
    assert kept(replace(state, imprint=whole), tok, user, "city") is True
    cue = imprint_spans(Imprint.empty(model.config), keys, keys, [SpanChoice(0, 9, 5.0)], turn=0, tokens=ids)  # "I live in"
    assert kept(replace(state, imprint=cue), tok, user, "city") is False
    private = imprint_spans(Imprint.empty(model.config), keys, keys, [SpanChoice(0, n, 5.0)], turn=0, tokens=None)
    assert kept(replace(state, imprint=private), tok, user, "city") is None


def test_the_natural_eval_writes_its_figures_and_targets(tmp_path: Path) -> None:
    from sia.learn.natural_eval import NaturalOptions, run_natural_eval

    model = _tiny()
    options = NaturalOptions(part="tune", depths=(0, 4), modes=("state", "fresh"), users=2, conversations=3)
    figures = run_natural_eval(model, tmp_path, options)
    assert [f["depth"] for f in figures["state"]] == [0, 4] and len(figures["fresh"]) == 1
    names = [t["name"] for t in figures["targets"]]
    assert "every fact of a user >= 60%" in names and "reply perplexity <= 1.05x base" in names
    p = figures["perplexity"]
    assert p["tokens"] > 0 and math.isclose(p["ratio"], p["state"] / p["base"])
    assert figures["state_bytes"] > model.config.state_bytes - 2048
    report = (tmp_path / "report.md").read_text()
    assert "| state | 4 |" in report and "| fresh | – |" in report
    assert 0.0 <= figures["state"][0]["kept"] <= 1.0 and "right when imprinted" in report
    assert json.loads((tmp_path / "figures.json").read_text())["users"] == 2
    # no dialogue asked for: recall without the perplexity, and no target that needs it
    quick = run_natural_eval(model, tmp_path / "quick", replace(options, depths=(0,), modes=("state",), conversations=0))
    assert "perplexity" not in quick and "reply perplexity <= 1.05x base" not in [t["name"] for t in quick["targets"]]
    assert "Reply perplexity" not in (tmp_path / "quick" / "report.md").read_text()
    assert quick["keep_text"] and "Privacy mode" not in (tmp_path / "quick" / "report.md").read_text()
    # privacy mode: the imprint keeps no token ids, so the write's share cannot be read from its words
    privacy = replace(options, depths=(0,), modes=("state",), conversations=0, keep_text=False)
    private = run_natural_eval(model, tmp_path / "private", privacy)
    assert private["keep_text"] is False and "kept" not in private["state"][0]
    assert "Privacy mode: the imprint keeps no token ids." in (tmp_path / "private" / "report.md").read_text()
    with pytest.raises(ValueError, match="conversations"):
        NaturalOptions(conversations=-1)
