from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from functools import cache
from typing import TypeVar

import pytest

from sia.learn.native.corpus import (
    FACTS,
    MAX_MESSAGE_CHARS,
    NAMES,
    PIECES,
    PLAIN_PIECES,
    SHOCK_KINDS,
    SPLITS,
    TEMPLATES,
    Corpus,
    Episode,
    iter_text,
    make_corpus,
    make_episode,
    short_episode,
)
from sia.personas import PERSONAS, persona_preamble

T = TypeVar("T")

MAX_CHARS = MAX_MESSAGE_CHARS
CONTEXT_BYTES = 512


@cache
def corpus() -> Corpus:
    return make_corpus(1234, 5000, 1500)


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"\b{re.escape(word)}\b", text, flags=re.IGNORECASE) is not None


def _all_values() -> list[str]:
    return [v for values in FACTS.values() for v in values]


def _all_episodes() -> tuple[Episode, ...]:
    return corpus().train + corpus().heldout


# ---- interface and configuration -------------------------------------------------------------------------


def test_personas_and_facts() -> None:
    assert "sia" in PERSONAS
    assert 3 <= len(PERSONAS) <= 4
    assert len(FACTS["colour"]) == 12 and len(FACTS["pet"]) == 8 and len(FACTS["mood"]) == 6
    for kind, values in FACTS.items():
        assert len(set(values)) == len(values), kind
        assert all(v.isascii() and v == v.lower() and v.isalpha() for v in values), kind
    every = _all_values()
    assert len(set(every)) == len(every)  # no value belongs to two facts
    for a in every:
        assert not any(a != b and _has_word(b, a) for b in every)


def test_persona_preamble() -> None:
    preambles = {p: persona_preamble(p) for p in PERSONAS}
    assert preambles["sia"] == "[sia]"
    assert len(set(preambles.values())) == len(PERSONAS)
    for persona, text in preambles.items():
        assert persona in text and text.isascii() and len(text) <= 16
    for bad in ("", "SIA", "nobody"):
        with pytest.raises(ValueError, match="unknown persona"):
            persona_preamble(bad)


def test_make_episode_rejects_unknown_split_and_persona() -> None:
    with pytest.raises(ValueError, match="unknown split"):
        make_episode(random.Random(0), "test")
    with pytest.raises(ValueError, match="unknown persona"):
        make_episode(random.Random(0), "train", persona="nobody")
    with pytest.raises(ValueError, match=">= 0"):
        make_corpus(0, -1, 1)


def test_requested_persona_is_used() -> None:
    rng = random.Random(5)
    for persona in PERSONAS:
        for split in SPLITS:
            episode = make_episode(rng, split, persona)
            assert episode.persona == persona
            assert episode.user in NAMES[split]


# ---- determinism -----------------------------------------------------------------------------------------


def test_same_seed_same_corpus_and_different_seed_differs() -> None:
    a = make_corpus(7, 300, 100)
    assert a == make_corpus(7, 300, 100)
    b = make_corpus(8, 300, 100)
    assert a.train != b.train and a.heldout != b.heldout
    assert len(a.train) == 300 and len(a.heldout) == 100
    # each split has its own stream: the train episodes do not depend on how many held-out ones are drawn
    assert make_corpus(7, 300, 5).train == a.train
    assert make_corpus(7, 0, 0) == Corpus((), ())


def test_make_episode_is_a_function_of_the_rng_state() -> None:
    first = [make_episode(random.Random(s), "train") for s in range(20)]
    again = [make_episode(random.Random(s), "train") for s in range(20)]
    assert first == again
    assert len(set(first)) > 15


def test_global_random_state_is_untouched() -> None:
    random.seed(99)
    expected = random.random()
    random.seed(99)
    make_corpus(3, 50, 50)
    assert random.random() == expected


# ---- held-out split --------------------------------------------------------------------------------------


def test_pools_are_disjoint_between_splits() -> None:
    train, heldout = TEMPLATES["train"], TEMPLATES["heldout"]
    assert set(train) == set(heldout)
    for kind in train:
        assert train[kind] and heldout[kind], kind
        assert len(set(train[kind])) == len(train[kind]), kind
        assert not set(train[kind]) & set(heldout[kind]), kind
    all_train = {t for pool in train.values() for t in pool}
    all_heldout = {t for pool in heldout.values() for t in pool}
    assert not all_train & all_heldout
    assert NAMES["train"] and NAMES["heldout"]
    assert not set(NAMES["train"]) & set(NAMES["heldout"])
    for fact in FACTS:
        assert f"state.{fact}" in train and f"ask.{fact}" in train
        for persona in PERSONAS:
            assert f"reply.{persona}.probe.{fact}" in train
    for kind in SHOCK_KINDS:
        assert f"shock.{kind}" in train


def test_heldout_messages_never_appear_in_train() -> None:
    c = corpus()
    train_users = {turn.user for e in c.train for turn in e.turns}
    heldout_users = {turn.user for e in c.heldout for turn in e.turns}
    assert not train_users & heldout_users
    train_replies = {turn.reply for e in c.train for turn in e.turns}
    heldout_replies = {turn.reply for e in c.heldout for turn in e.turns}
    assert not train_replies & heldout_replies
    assert {e.user for e in c.train} <= set(NAMES["train"])
    assert {e.user for e in c.heldout} <= set(NAMES["heldout"])
    # the held-out episodes use their whole pools of names and small talk, and every persona
    assert {e.user for e in c.heldout} == set(NAMES["heldout"])
    assert heldout_users >= set(TEMPLATES["heldout"]["smalltalk"])
    assert {e.persona for e in c.heldout} == set(PERSONAS) == {e.persona for e in c.train}


# ---- templates -------------------------------------------------------------------------------------------


def test_fact_sentences_are_composed_from_disjoint_pieces() -> None:
    assert set(PIECES["train"]) == set(PIECES["heldout"])
    kinds = set(PIECES["train"])
    assert {k for k in TEMPLATES["train"] if k.startswith(("state.", "ask.")) or ".probe." in k} == kinds
    for kind in kinds:
        train, heldout = PIECES["train"][kind], PIECES["heldout"][kind]
        openers, cores, closers = (set(train[i]) & set(heldout[i]) for i in range(3))
        assert not cores, (kind, cores)  # the wording around the value is never seen in training
        assert openers <= PLAIN_PIECES and closers <= PLAIN_PIECES, (kind, openers, closers)
        for split, (o, c, e) in (("train", train), ("heldout", heldout)):
            assert len(TEMPLATES[split][kind]) == len(set(TEMPLATES[split][kind])) == len(o) * len(c) * len(e), kind
            # every template holds a core of its split, and none of the other split
            other = heldout[1] if split == "train" else train[1]
            for template in TEMPLATES[split][kind]:
                assert sum(core[1:] in template for core in c) >= 1, (kind, template)
                assert not any(core[1:] in template for core in other), (kind, template)
    # variety: many phrasings per fact in training, so that no handful of sentences can be learnt by heart
    for fact in FACTS:
        assert len(TEMPLATES["train"][f"state.{fact}"]) >= 200
        assert len(TEMPLATES["train"][f"ask.{fact}"]) >= 30
        assert all(len(TEMPLATES["train"][f"reply.{p}.probe.{fact}"]) >= 40 for p in PERSONAS)


def test_composed_sentences_read_as_sentences() -> None:
    for split in SPLITS:
        for kind in PIECES[split]:
            for template in TEMPLATES[split][kind]:
                assert "  " not in template and not template.startswith(" "), template
                assert template.rstrip()[-1] in ".!?", template
                if not kind.startswith("reply.bolt."):
                    assert template[0].isupper(), template
                    # after a full stop the next word is capitalised, after a comma or colon it is not
                    for word in re.findall(r"[.!?] ([A-Za-z])", template):
                        assert word.isupper(), template
                else:
                    assert template == template.lower(), template  # bolt writes in lowercase


def test_template_placeholders_and_value_hygiene() -> None:
    values = _all_values()
    for split in SPLITS:
        for kind, pool in TEMPLATES[split].items():
            for template in pool:
                assert template.isascii(), template
                stripped = template.replace("{name}", "").replace("{value}", "")
                assert "{" not in stripped and "}" not in stripped, template
                assert ("{name}" in template) == (kind in ("greet", *(f"reply.{p}.greet" for p in PERSONAS))), template
                has_value = kind.startswith("state.") or ".probe." in kind
                assert template.count("{value}") == (1 if has_value else 0), template
                # no fact value appears outside the slot (so the only source of an answer is the statement)
                assert not any(_has_word(stripped, v) for v in values), template


def test_probe_prefix_and_suffix_contain_no_candidate() -> None:
    for split in SPLITS:
        for persona in PERSONAS:
            for fact, values in FACTS.items():
                for template in TEMPLATES[split][f"reply.{persona}.probe.{fact}"]:
                    prefix, suffix = template.split("{value}")
                    for v in values:
                        assert v not in prefix.lower() and v not in suffix.lower(), (template, v)


def test_persona_styles_differ() -> None:
    for split in SPLITS:
        for kind in ("greet", "ack", "smalltalk", "hostile", "emotional", "odd", "brief", *(f"probe.{f}" for f in FACTS)):
            pools = [set(TEMPLATES[split][f"reply.{p}.{kind}"]) for p in PERSONAS]
            union = set().union(*pools)
            assert len(union) == sum(len(p) for p in pools), (split, kind)  # no reply wording shared by two personas
        prefixes = [{t.split("{value}")[0] for f in FACTS for t in TEMPLATES[split][f"reply.{p}.probe.{f}"]} for p in PERSONAS]
        assert len(set().union(*prefixes)) == sum(len(p) for p in prefixes)


# ---- episodes and probes ---------------------------------------------------------------------------------


def test_episode_shape() -> None:
    lengths = Counter(len(e.turns) for e in _all_episodes())
    assert set(lengths) == {4, 5, 6}
    for e in _all_episodes():
        assert e.probes, e
        assert not e.turns[0].shock
        probe_turns = [p.turn for p in e.probes]
        assert len(set(probe_turns)) == len(probe_turns)
        assert len({p.fact for p in e.probes}) == len(e.probes)  # each fact asked about at most once
        assert e.user in e.turns[0].user and e.user in e.turns[0].reply  # the persona echoes the name
        for p in e.probes:
            assert not e.turns[p.turn].shock


def test_probes_are_consistent() -> None:
    source_turns: Counter[int] = Counter()
    for e in _all_episodes():
        for p in e.probes:
            assert p.turn >= 2 and p.turn < len(e.turns)
            assert 0 <= p.source_turn < p.turn - 1
            assert p.candidates == FACTS[p.fact]
            assert p.answer in p.candidates
            reply = e.turns[p.turn].reply
            assert reply.startswith(p.prefix)
            assert reply[len(p.prefix) : len(p.prefix) + len(p.answer)] == p.answer
            assert reply.count(p.answer) == 1
            assert not any(v in p.prefix.lower() for v in p.candidates)
            # the value is stated at the source turn, and in no other user message before the question
            assert _has_word(e.turns[p.source_turn].user, p.answer)
            for t in range(p.turn):
                if t != p.source_turn:
                    assert not _has_word(e.turns[t].user, p.answer), (e, p)
                    assert not _has_word(e.turns[t].reply, p.answer), (e, p)
                    assert not any(_has_word(e.turns[t].user, v) for v in p.candidates), (e, p)
            # the question names the fact, never the value
            assert not any(_has_word(e.turns[p.turn].user, v) for v in p.candidates)
            source_turns[p.source_turn] += 1
    assert source_turns[0] > 0 and sum(n for t, n in source_turns.items() if t > 0) > 0


def test_answers_are_balanced() -> None:
    episodes = make_corpus(2024, 3000, 0).train
    by_fact: dict[str, Counter[str]] = {fact: Counter() for fact in FACTS}
    for e in episodes:
        for p in e.probes:
            by_fact[p.fact][p.answer] += 1
    fact_totals = [sum(c.values()) for c in by_fact.values()]
    assert max(fact_totals) <= 2 * min(fact_totals)
    for fact, counts in by_fact.items():
        assert set(counts) == set(FACTS[fact]), fact
        assert max(counts.values()) <= 3 * min(counts.values()), (fact, counts)
    personas = Counter(e.persona for e in episodes)
    assert set(personas) == set(PERSONAS) and max(personas.values()) <= 1.5 * min(personas.values())


def test_shocks_are_common_but_not_everywhere() -> None:
    episodes = _all_episodes()
    with_shock = sum(any(t.shock for t in e.turns) for e in episodes) / len(episodes)
    assert 0.2 <= with_shock <= 0.8
    shock_users = {t.user for e in episodes for t in e.turns if t.shock}
    for split in SPLITS:
        for kind in SHOCK_KINDS:
            assert shock_users & set(TEMPLATES[split][f"shock.{kind}"]), (split, kind)
    all_shock_lines = {line for split in SPLITS for kind in SHOCK_KINDS for line in TEMPLATES[split][f"shock.{kind}"]}
    assert shock_users <= all_shock_lines
    for e in episodes:
        for t in e.turns:
            assert (t.user in all_shock_lines) == t.shock


def test_brevity_request_shortens_later_replies() -> None:
    brief_requests = {line for split in SPLITS for line in TEMPLATES[split]["brief"]}
    n_brief = n_long_suffix = 0
    for e in _all_episodes():
        asked = any(req in e.turns[0].user for req in brief_requests)
        n_brief += asked
        for p in e.probes:
            suffix = e.turns[p.turn].reply[len(p.prefix) + len(p.answer) :]
            if asked:
                assert suffix in (".", "!"), e
            elif len(suffix) > 1:
                n_long_suffix += 1
        if asked:
            brief_replies = {r for split in SPLITS for r in TEMPLATES[split][f"reply.{e.persona}.brief"]}
            probe_turns = {p.turn for p in e.probes}
            for i, t in enumerate(e.turns[1:], start=1):
                if i not in probe_turns and not t.shock:
                    assert t.reply in brief_replies, e
    assert 0.1 * len(_all_episodes()) < n_brief < 0.35 * len(_all_episodes())
    assert n_long_suffix > 0


def test_lengths_fit_the_context() -> None:
    for e in _all_episodes():
        preamble = persona_preamble(e.persona)
        for t in e.turns:
            assert t.user.isascii() and t.reply.isascii()
            assert 0 < len(t.user) <= MAX_CHARS and 0 < len(t.reply) <= MAX_CHARS, t
            assert len((preamble + t.user + t.reply).encode()) + 8 <= CONTEXT_BYTES // 2


def test_longest_possible_messages_fit() -> None:
    """Worst case over the pools, not just the sampled corpus: every template with the longest name and value
    fits, and a greeting with two facts (or a fact and a brevity request) has a fitting draw to settle on."""
    longest_value = {fact: max(len(v) for v in values) for fact, values in FACTS.items()}
    for split in SPLITS:
        pools = TEMPLATES[split]
        name = max(len(n) for n in NAMES[split])
        greet = max(len(t) for t in pools["greet"]) - len("{name}") + name
        shortest = sorted(min(len(t) for t in pools[f"state.{f}"]) - len("{value}") + longest_value[f] for f in FACTS)
        longest = sorted(max(len(t) for t in pools[f"state.{f}"]) - len("{value}") + longest_value[f] for f in FACTS)
        brief = max(len(t) for t in pools["brief"])
        assert greet + 1 + shortest[-1] + 1 + shortest[-2] <= 0.7 * MAX_CHARS  # most draws fit at once
        assert greet + 1 + longest[-1] + 1 + brief <= MAX_CHARS  # greeting, one fact and a brevity request
        assert max(len(t) for t in pools["mention"]) + longest[-1] <= MAX_CHARS
        for kind, pool in pools.items():
            for template in pool:
                size = len(template.replace("{name}", "x" * name).replace("{value}", "x" * max(longest_value.values())))
                assert size <= MAX_CHARS, (kind, template)


def test_iter_text_yields_every_message() -> None:
    episodes = corpus().heldout[:50]
    texts = list(iter_text(episodes))
    assert len(texts) == 2 * sum(len(e.turns) for e in episodes)
    assert texts[0] == episodes[0].turns[0].user and texts[1] == episodes[0].turns[0].reply


class CountingRandom(random.Random):
    """A generator that counts the draws ``make_episode`` takes from it."""

    draws = 0

    def choice(self, seq: Sequence[T]) -> T:
        self.draws += 1
        return super().choice(seq)


def test_generation_draws_a_bounded_number_of_times() -> None:
    # the greeting is redrawn until it fits MAX_CHARS: that loop must end after a redraw or two, or corpus
    # generation slows without bound (its speed is measured in benchmarks/corpus.py)
    rng = CountingRandom(11)
    draws = []
    for _ in range(5_000):
        before = rng.draws
        episode = make_episode(rng, "train")
        draws.append(rng.draws - before)
        assert rng.draws - before <= 4 * len(episode.turns) + 6, episode
    assert sum(draws) / len(draws) < 20


def test_short_episodes_keep_the_fact_one_turn_and_the_probe() -> None:
    episodes = corpus().train[:200]
    for episode in episodes:
        short = short_episode(episode)
        probe = episode.probes[0]
        assert short.turns == (episode.turns[probe.source_turn], episode.turns[probe.source_turn + 1], episode.turns[probe.turn])
        assert len(short.probes) == 1
        (kept,) = short.probes
        assert (kept.turn, kept.source_turn, kept.answer, kept.prefix) == (2, 0, probe.answer, probe.prefix)
        assert probe.answer in short.turns[0].user and short.turns[2].reply.startswith(probe.prefix + probe.answer)
    assert any(e.probes[0].source_turn > 0 for e in episodes)  # facts mentioned later are cut around too
