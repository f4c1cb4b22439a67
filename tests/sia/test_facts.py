"""The fact-dialogue generator: determinism, disjoint splits, episode structure, clean chit-chat, variety."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import random
import re
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from sia.learn.adapter.facts import (
    _STYLES,
    CLOSED_KINDS,
    CLOSED_VALUES,
    KINDS,
    OPEN_KINDS,
    PHRASES_FILE,
    SPLITS,
    Episode,
    chitchat,
    draw_kinds,
    episodes,
    make_episode,
    read_phrases,
    values,
    wordings,
)

# colour words beyond the values: chit-chat must hold none at all
OTHER_COLOURS = ("black", "white", "pink", "brown", "grey", "gray", "violet", "gold", "silver", "turquoise", "indigo")


@cache
def corpus(split: str) -> tuple[Episode, ...]:
    return tuple(episodes(split, 300, 11, between=2))


def value_words() -> set[str]:
    return {v for kind in KINDS for split in SPLITS for v in values(kind, split)} | set(OTHER_COLOURS)


def has_word(text: str, word: str) -> bool:
    return re.search(rf"\b{re.escape(word)}\b", text, flags=re.IGNORECASE) is not None


def texts(eps: tuple[Episode, ...]) -> set[str]:
    out = set()
    for ep in eps:
        for turn in ep.turns:
            out |= {turn.user, turn.reply}
        for probe in ep.probes:
            out |= {probe.question, probe.reply}
    return out


def skeleton(ep: Episode) -> str:
    """The statement message with each value replaced by its kind."""
    message = ep.turns[ep.stated_at].user
    for fact in ep.facts:
        message = re.sub(rf"\b{re.escape(fact.value)}\b", "{" + fact.kind + "}", message, flags=re.IGNORECASE)
    return message


def test_values_per_split() -> None:
    for kind in CLOSED_KINDS:
        assert values(kind, "train") == values(kind, "heldout") == CLOSED_VALUES[kind]
    for kind in OPEN_KINDS:
        train, heldout = set(values(kind, "train")), set(values(kind, "heldout"))
        assert not train & heldout
        assert len(train) == len(values(kind, "train")) and len(heldout) == len(values(kind, "heldout"))
    assert len(values("name", "train")) >= 60 and len(values("name", "heldout")) >= 24
    assert len(values("city", "train")) >= 50 and len(values("city", "heldout")) >= 24
    assert "Buenos Aires" in values("city", "train")
    all_open = [v for kind in OPEN_KINDS for split in SPLITS for v in values(kind, split)]
    assert len(set(all_open)) == len(all_open)  # no name is also a city


def test_deterministic() -> None:
    a = episodes("train", 40, 3, between=4)
    assert a == episodes("train", 40, 3, between=4)
    assert a != episodes("train", 40, 4, between=4)
    assert [ep.user for ep in a[:2]] == ["train-3-000000", "train-3-000001"]
    assert episodes("heldout", 5, 3, between=1, kinds=["pet", "job"]) == episodes(
        "heldout", 5, 3, between=1, kinds=("pet", "job")
    )
    one = make_episode(random.Random(5), "heldout", between=3, user="u")
    assert one == make_episode(random.Random(5), "heldout", between=3, user="u")


def test_the_corpus_is_the_one_every_shipped_adapter_was_trained_and_measured_on() -> None:
    """A digest of 120 episodes of both splits and every wording, pinned: moving the phrase tables (or touching how an
    episode is drawn) must leave the corpus byte for byte as it was, or every shipped figure stops being reproducible."""
    digest = hashlib.sha256()
    for split, seed, kinds in (("train", 0, None), ("heldout", 104, ("colour", "pet", "hobby")), ("heldout", 3, None)):
        for episode in episodes(split, 40, seed, between=4, kinds=kinds):
            digest.update(json.dumps(asdict(episode), sort_keys=True).encode())
        digest.update(json.dumps(sorted(wordings(split))).encode())
    assert digest.hexdigest() == "2c180438421cebd382ff000aad1cea0e6020a2ace89ec33614e1d5e2c892df05"


def test_the_phrase_tables_ship_with_the_package_and_a_broken_one_is_refused_named(tmp_path: Path) -> None:
    """The tables live in sia/learn/data/facts_phrases.json, which pyproject's package data carries (as it carries
    the native model's native_phrases.json); a table missing or of the wrong shape is refused with its name."""
    package_data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for name in ("facts_phrases.json", "native_phrases.json"):
        assert any(fnmatch.fnmatch(f"learn/data/{name}", glob) for glob in package_data["sia"]), name
    assert read_phrases()[0] == CLOSED_VALUES and read_phrases()[3] == _STYLES
    tables = json.loads(PHRASES_FILE.read_text(encoding="utf-8"))

    def broken(change: Callable[[dict[str, Any]], None]) -> Path:
        data = json.loads(json.dumps(tables))
        change(data)
        path = tmp_path / "phrases.json"
        path.write_text(json.dumps(data))
        return path

    cases: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (lambda d: d.pop("names"), "lacks the table 'names'"),
        (lambda d: d["styles"].pop("heldout"), r"styles must be an object with the keys \['heldout', 'train'\]"),
        (lambda d: d["styles"]["train"]["clauses"].pop("pet"), "styles.train.clauses must be an object"),
        (lambda d: d["styles"]["train"].pop("openers"), "styles.train.openers must be a non-empty list of strings"),
        (
            lambda d: d["styles"]["heldout"]["chitchat"].append(["only the user"]),
            r"styles.heldout.chitchat\[\d+\] must be a pair",
        ),
        (lambda d: d["styles"]["train"]["direct"]["city"][0].pop("answers"), r"direct.city\[0\] must be"),
        (lambda d: d["styles"]["train"].update(connectors=[", "]), "connectors must hold at least 5"),
        (lambda d: d["closed_values"].update(pet=[]), "closed_values.pet must be a non-empty list"),
    ]
    for change, match in cases:
        with pytest.raises(ValueError, match=match):
            read_phrases(broken(change))


def test_wordings_disjoint() -> None:
    train, heldout = wordings("train"), wordings("heldout")
    assert len(train) > 250 and len(heldout) > 100
    assert not train & heldout


def test_generated_texts_disjoint() -> None:
    assert not texts(corpus("train")) & texts(corpus("heldout"))
    for kind in OPEN_KINDS:
        used = {split: {f.value for ep in corpus(split) for f in ep.facts if f.kind == kind} for split in SPLITS}
        assert used["train"] and used["heldout"] and not used["train"] & used["heldout"]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("between", [0, 1, 6])
def test_structure(split: str, between: int) -> None:
    for ep in episodes(split, 60, 2, between=between):
        assert ep.split == split and ep.between == between
        assert ep.stated_at + 1 + between == len(ep.turns) and ep.stated_at in (0, 1)
        assert len(ep.facts) == 3 and len({f.kind for f in ep.facts}) == 3
        statement = ep.turns[ep.stated_at]
        assert statement.user[0].isupper()
        assert not re.search(r"[.!?] [a-z]", statement.user)  # sentences start with a capital
        for fact in ep.facts:
            assert fact.value in values(fact.kind, split)
            assert has_word(statement.user, fact.value)
        others = value_words() - {f.value for f in ep.facts if f.kind == "name"}
        assert not [w for w in others if has_word(statement.reply, w)]  # the acknowledgement repeats no value but the name
        assert [(p.kind, p.value) for p in ep.probes] == [(f.kind, f.value) for f in ep.facts]
        for probe in ep.probes:
            assert probe.reply == f"{probe.reply_prefix} {probe.value}{probe.reply_suffix}"
            assert probe.reply_prefix and probe.reply_prefix == probe.reply_prefix.strip()
            assert not [w for w in value_words() if has_word(probe.reply_prefix + probe.reply_suffix, w)]
        pairs = [(t.user, t.reply) for i, t in enumerate(ep.turns) if i != ep.stated_at]
        assert len(set(pairs)) == len(pairs)


def test_articles_fit_values() -> None:
    for split in SPLITS:
        for ep in corpus(split):
            for text in [ep.turns[ep.stated_at].user, *(p.reply for p in ep.probes)]:
                assert not re.search(r"\ba [aeiou]", text, flags=re.IGNORECASE), text
                assert not re.search(r"\ban [^aeiou]", text, flags=re.IGNORECASE), text
    jobs = [ep for ep in episodes("train", 200, 1, between=0, kinds=["job"]) if ep.facts[0].value == "engineer"]
    assert any(re.search(r"\ban engineer\b", ep.turns[0].user, flags=re.IGNORECASE) for ep in jobs)


def test_kinds_and_opening() -> None:
    ep = make_episode(random.Random(1), "train", between=2, kinds=["pet", "name"], opening=2)
    assert [f.kind for f in ep.facts] == ["pet", "name"] and ep.stated_at == 2 and len(ep.turns) == 5
    assert len(make_episode(random.Random(1), "heldout", between=0, n_facts=6).facts) == 6
    openings = Counter(ep.stated_at for ep in corpus("train"))
    assert 0.55 < openings[0] / 300 < 0.85


def test_draw_kinds_follows_the_weights() -> None:
    """Distinct kinds, deterministic for a seed; a kind weighing 3 is drawn into far more episodes than the others, one
    weighing 0 never; the others share what is left evenly."""
    assert draw_kinds(random.Random(4), 3, {"hobby": 3}) == draw_kinds(random.Random(4), 3, {"hobby": 3})
    rng = random.Random(0)
    drawn = [draw_kinds(rng, 3, {"hobby": 3, "name": 0}) for _ in range(4000)]
    assert all(len(set(kinds)) == 3 for kinds in drawn)
    share = Counter(kind for kinds in drawn for kind in kinds)
    assert "name" not in share
    assert share["hobby"] / 4000 > 0.85  # exactly 1 - 4/7 · 3/6 · 2/5 = 0.886 (uniform among the five: 0.6)
    others = [share[kind] / 4000 for kind in KINDS if kind not in ("hobby", "name")]
    assert max(others) - min(others) < 0.05 and 0.45 < sum(others) / len(others) < 0.6
    assert set(draw_kinds(random.Random(1), 6, {})) == set(KINDS)


@pytest.mark.parametrize("split", SPLITS)
def test_chitchat_is_clean(split: str) -> None:
    pairs = chitchat(split)
    assert len(pairs) >= (80 if split == "train" else 30)
    assert len({p.user for p in pairs}) == len(pairs) and len({p.reply for p in pairs}) == len(pairs)
    words = value_words()
    for pair in pairs:
        found = [w for w in words if has_word(pair.user, w) or has_word(pair.reply, w)]
        assert not found, (pair, found)
        assert 1 <= len(re.findall(r"[.!?](\s|$)", pair.reply)) <= 3, pair.reply


def test_chitchat_never_repeats_in_an_episode() -> None:
    n = len(chitchat("heldout"))
    ep = make_episode(random.Random(2), "heldout", between=n - 1, opening=1)
    assert len({t.user for t in ep.turns}) == len(ep.turns)


@pytest.mark.parametrize(
    "call",
    [
        lambda: values("age", "train"),
        lambda: values("name", "test"),
        lambda: make_episode(random.Random(0), "dev", between=1),
        lambda: make_episode(random.Random(0), "train", between=-1),
        lambda: make_episode(random.Random(0), "train", between=1, opening=-1),
        lambda: make_episode(random.Random(0), "train", between=1, n_facts=0),
        lambda: make_episode(random.Random(0), "train", between=1, n_facts=7),
        lambda: make_episode(random.Random(0), "train", between=1, kinds=["pet", "pet"]),
        lambda: make_episode(random.Random(0), "train", between=1, kinds=["mood"]),
        lambda: make_episode(random.Random(0), "train", between=1, kinds=[]),
        lambda: make_episode(random.Random(0), "heldout", between=len(chitchat("heldout")), opening=1),
        lambda: episodes("train", -1, 0, between=1),
        lambda: draw_kinds(random.Random(0), 3, {"mood": 1}),
        lambda: draw_kinds(random.Random(0), 3, {"pet": -1}),
        lambda: draw_kinds(random.Random(0), 3, {"pet": float("nan")}),
        lambda: draw_kinds(random.Random(0), 5, {"pet": 0, "name": 0}),
        lambda: wordings("valid"),
        lambda: chitchat("valid"),
    ],
)
def test_argument_errors(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        call()


def test_template_counts() -> None:
    train, heldout = _STYLES["train"], _STYLES["heldout"]
    for kind in KINDS:
        assert len(set(train.clauses[kind])) >= 10 and len(set(heldout.clauses[kind])) >= 5
        assert len(train.direct[kind]) >= 8 and len(heldout.direct[kind]) >= 4
        assert len(train.indirect[kind]) >= 4 and len(heldout.indirect[kind]) >= 2
    assert len(train.acks_named + train.acks) >= 12 and len(heldout.acks_named + heldout.acks) >= 6
    assert not set(train.connectors) & set(heldout.connectors)


def test_variety() -> None:
    eps = episodes("train", 500, 0, between=1)
    assert len({skeleton(ep) for ep in eps}) >= 300
    assert len({p.question for ep in eps for p in ep.probes}) >= 60
    indirect = {q.text for qs in _STYLES["train"].indirect.values() for q in qs}
    share = sum(p.question in indirect for ep in eps for p in ep.probes) / (3 * len(eps))
    assert 0.28 < share < 0.39
    kinds = Counter(f.kind for ep in eps for f in ep.facts)
    assert set(kinds) == set(KINDS) and min(kinds.values()) > 150
