"""The reply-quality metrics (benchmarks.reply_metrics) on hand-made replies, the easy-question files, and a merged report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.reply_metrics import STYLES, answered, loops, style_ok, words, wrong_language
from benchmarks.reply_quality import merged, score
from sia.personas import PERSONAS

QUESTIONS = Path(__file__).parents[2] / "benchmarks" / "data" / "easy_questions"


def test_answered_finds_an_accept_string_at_the_start_of_a_word() -> None:
    assert answered("The capital of France is Paris.", ["paris"])
    assert answered("PARIS, of course!", ["paris"])
    assert answered("Spiders have eight legs.", ["8", "eight"])
    assert answered("It turns into a butterfly.", ["butterfl", "moth"])
    assert answered("A blue whale is the biggest.", ["blue whale"])
    assert not answered("I love comparisons.", ["paris"])  # inside a word, not at its start
    assert not answered("The capital of France is Lyon.", ["paris"])
    assert not answered("", ["paris"])


def test_a_number_must_be_a_whole_word() -> None:
    assert answered("7 plus 5 is 12.", ["12", "twelve"])
    assert answered("That makes twelve!", ["12", "twelve"])
    assert answered("It is twenty-five.", ["25", "twenty-five"])
    assert not answered("7 plus 5 is 120.", ["12", "twelve"])
    assert not answered("There are seventeen of them.", ["7", "seven"])
    assert not answered("Version 2.12 is out.", ["12"])  # a piece of a decimal
    assert not answered("It is 12.5 metres.", ["12"])
    assert answered("Twelve. Yes, 12.", ["12"])


def test_loops_are_repeated_word_trigrams_or_token_sixgrams() -> None:
    assert loops("I am here. I am here. I am here.")
    assert not loops("I am here. I am here.")  # a 3-gram twice is not yet a loop
    assert loops("Não pode ser mais, não pode ser mais, não pode ser mais dificil")
    assert not loops("Paris is the capital of France, and Paris is lovely.")
    assert loops("short", tokens=[1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 5, 6])
    assert not loops("short", tokens=[1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 5, 7])


def test_wrong_language_is_a_reply_without_any_english_stopword_or_mostly_not_ascii() -> None:
    assert wrong_language("Eu estes ao Ana Kowalski, ao que não pode ser mais dificil.")
    assert wrong_language("Bienvenue mon ami, je suis très content aujourd'hui.")
    assert wrong_language("Столица Франции это Париж, конечно")
    assert wrong_language("巴黎是法国的首都")
    assert not wrong_language("The capital of France is Paris.")
    assert not wrong_language("Paris!")  # too short to judge
    assert not wrong_language("Bienvenue! It's Paris, I'd say.")
    # Spanish and German share "es", "in", "die" with the English stopwords: a majority of their function words decides
    assert wrong_language("Este es un amigo, sí. Estoy en la ciudad de Madrid y este color no parece mucho más que el cielo.")
    assert wrong_language("Ze klubi, siska! Ich habe eine Kittelheit für die Stadt. Ich bin in Berlin, das ist klar.")
    assert not wrong_language("Hola! Welcome to our beautiful city. I'm so glad you're here, Lucía.")
    assert not wrong_language("You live in Rio de Janeiro, and your name is Ana de la Cruz. Is that right?")
    assert not wrong_language("I love the song Que Sera Sera, and Los Angeles in the spring.")


def test_words_are_lower_cased_with_inner_apostrophes() -> None:
    assert words("It's Paris, Sir—twenty-five!") == ["it's", "paris", "sir", "twenty-five"]


@pytest.mark.parametrize(
    ("persona", "reply", "ok"),
    [
        ("sia", "Paris is the capital of France. It is a lovely city.", True),
        ("sia", "paris is the capital of france.", False),  # not a capital letter first
        ("sia", "Paris is the capital of France, and", False),  # not a complete sentence
        ("bolt", "paris.", True),
        ("bolt", "Paris.", False),  # a capital letter
        ("bolt", "sure, it's paris.", False),  # a pleasantry
        ("bolt", "his answer: paris.", True),  # "hi" only as a whole word
        ("bolt", "the capital of france is paris, a city on the seine with many old bridges and museums", False),
        ("pip", "Paris! I love Paris!", True),
        ("pip", "Paris.", False),
        ("marlow", "It is Paris, sir.", True),
        ("marlow", "Paris, Madam, if I may.", True),
        ("marlow", "Paris, my good friend.", False),
        ("marlow", "The sirloin is in Paris.", False),
        ("someone", "Paris.", True),
        ("someone", "", False),
        ("someone", "la la la la la la la la la la", False),  # a loop
    ],
)
def test_style_per_persona(persona: str, reply: str, ok: bool) -> None:
    assert style_ok(persona, reply) is ok


def test_every_default_persona_has_a_style_check() -> None:
    assert set(STYLES) == set(PERSONAS)


def test_the_question_files_are_well_formed_and_apart() -> None:
    seen: dict[str, set[str]] = {}
    for part, least in (("tune", 75), ("heldout", 80)):
        rows = [json.loads(line) for line in (QUESTIONS / f"{part}.jsonl").read_text().splitlines()]
        assert len(rows) >= least
        assert len({r["id"] for r in rows}) == len(rows)
        for r in rows:
            assert set(r) == {"id", "question", "accept", "kind"}
            assert r["kind"] in ("fact", "arithmetic", "definition", "advice")
            assert r["accept"] and all(a == a.lower() and a.strip() for a in r["accept"])
        seen[part] = {r["question"].lower() for r in rows}
    assert not seen["tune"] & seen["heldout"]


def test_a_merged_report_replaces_the_personas_run_and_keeps_the_others() -> None:
    setup = {"part": "heldout", "questions": 2, "limit": None, "checkpoint": "c", "overrides": {}}
    old_decoding = {"default": {"temperature": 0.4}, "greedy": {"temperature": 0.0}}
    earlier = {
        "machine": {"cpu": "a"},
        "setup": {**setup, "prompts": {"sia": "s", "bolt": "b"}, "decodings": old_decoding, "seconds": 9.0},
        "results": {"sia": {"default": {"answered": 0.5}}, "bolt": {"default": {"answered": 0.25}}},
    }
    run = {
        "machine": {"cpu": "b"},
        "setup": {**setup, "prompts": {"bolt": "b2"}, "decodings": {"bolt": {"default": {"lowercase": True}}}, "seconds": 3.0},
        "results": {"bolt": {"default": {"answered": 0.75}}},
    }
    out = merged(earlier, run)
    assert out["results"] == {"sia": {"default": {"answered": 0.5}}, "bolt": {"default": {"answered": 0.75}}}
    assert out["setup"]["prompts"] == {"sia": "s", "bolt": "b2"}
    assert out["setup"]["decodings"] == {"sia": old_decoding, "bolt": {"default": {"lowercase": True}}}
    assert out["setup"]["runs"] == {"bolt": {"machine": {"cpu": "b"}, "seconds": 3.0}}
    with pytest.raises(SystemExit, match="must match"):
        merged(earlier, {**run, "setup": {**run["setup"], "part": "tune"}})
    assert merged(earlier, {**run, "setup": {**run["setup"], "seed": 0}})["results"] == out["results"]  # before --seed: 0
    with pytest.raises(SystemExit, match="seed must match"):  # figures of another draw under this file's seed
        merged(earlier, {**run, "setup": {**run["setup"], "seed": 1}})


def test_a_reply_the_token_limit_ended_counts_as_cut() -> None:
    questions = [{"id": f"q{i}", "kind": "fact", "question": "What colour is the sky?", "accept": ["blue"]} for i in range(4)]
    replies = [
        {"reply": "The sky is blue, sir.", "tokens": [1, 2, 3], "finish": "stop"},
        {"reply": "The sky is blue, sir, and on a fine day it is the colour of", "tokens": [4, 5], "finish": "length"},
        {"reply": "Blue, sir.", "tokens": [6], "finish": "stop"},
        {"reply": "It is", "tokens": [7], "finish": "length"},
    ]
    s = score("marlow", questions, replies)
    assert [r["cut"] for r in s["replies"]] == [False, True, False, True]
    assert s["cut"] == 0.5 and s["answered"] == 0.75
