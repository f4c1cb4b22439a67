from __future__ import annotations

import copy
import math
import re
from dataclasses import replace

import pytest
import torch

from sia.identity.state import IdentityState
from sia.model.config import ModelConfig
from sia.model.generate import (
    END_PULL,
    NUCLEUS_FIRST,
    WIND_PULL,
    WIND_SHARE,
    ReplyDecoder,
    Sampling,
    SamplingParams,
    capitalised,
    exclaimed,
    exclamation_pairs,
    generate,
    likeliest,
    lowered,
    nucleus,
    nucleus_reference,
    penalize,
    repeated_ngram_bans,
    sample_next,
    sentences_end,
    stream,
)
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer
from tests.conftest import random_state, sharpen

PROMPTS = [list(b"hello there, persona"), list(b"hi"), list(b"what is my name?")]


def _cond(model: SIAModel, config: ModelConfig, n: int = 3):  # type: ignore[no-untyped-def]
    states = [IdentityState.fresh(config), random_state(config, 1), random_state(config, 2)]
    return model.condition_states(states[:n])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_generation_equals_uncached(model: SIAModel, config: ModelConfig, temperature: float) -> None:
    params = SamplingParams(max_new_tokens=24, temperature=temperature, seed=11)
    cached = generate(model, PROMPTS, _cond(model, config), params)
    uncached = generate(model, PROMPTS, _cond(model, config), params, use_cache=False)
    assert [g.tokens for g in cached] == [g.tokens for g in uncached]
    for a, b in zip(cached, uncached, strict=True):
        torch.testing.assert_close(a.stats.hidden, b.stats.hidden, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.prompt_nll, b.prompt_nll)
        assert a.stats.count.item() == b.stats.count.item()


def test_seed_reproduces_and_differs(model: SIAModel, config: ModelConfig) -> None:
    params = SamplingParams(max_new_tokens=32, temperature=1.0, seed=5)
    a = generate(model, PROMPTS[:1], _cond(model, config, 1), params)[0].tokens
    b = generate(model, PROMPTS[:1], _cond(model, config, 1), params)[0].tokens
    c = generate(model, PROMPTS[:1], _cond(model, config, 1), SamplingParams(max_new_tokens=32, temperature=1.0, seed=6))[
        0
    ].tokens
    assert a == b and a != c


def test_batched_rows_equal_solo_rows(model: SIAModel, config: ModelConfig) -> None:
    """Rows of different lengths and different identity states give what each gives alone."""
    params = SamplingParams(max_new_tokens=16, temperature=0.7, top_k=50, seed=3)
    states = [IdentityState.fresh(config), random_state(config, 1), random_state(config, 2)]
    batched = generate(model, PROMPTS, model.condition_states(states), params)
    for b, state in enumerate(states):
        solo = generate(model, [PROMPTS[b]], model.condition_states([state]), params)[0]
        assert solo.tokens == batched[b].tokens
        torch.testing.assert_close(solo.prompt_nll, batched[b].prompt_nll, atol=1e-5, rtol=1e-5)
        assert batched[b].prompt_nll.shape == (len(PROMPTS[b]) - 1,)


def test_nll_from_scores_the_prompt_from_there_on_and_changes_nothing_else(model: SIAModel, config: ModelConfig) -> None:
    """``nll_from``: the prompt NLL before each row's start is NaN (its logits are not computed), from there on it
    is the full computation's, and the tokens and the turn statistics are unchanged; a start outside its prompt
    is refused."""
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    full = generate(model, PROMPTS, _cond(model, config), params)
    starts = [5, 0, 9]
    part = generate(model, PROMPTS, _cond(model, config), params, nll_from=starts)
    for a, b, start in zip(full, part, starts, strict=True):
        assert a.tokens == b.tokens
        assert bool(b.prompt_nll[:start].isnan().all()) and not bool(b.prompt_nll[start:].isnan().any())
        torch.testing.assert_close(b.prompt_nll[start:], a.prompt_nll[start:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b.stats.hidden, a.stats.hidden)
    for bad in ([0, 0], [0, 2, 0], [-1, 0, 0]):  # "hi" scores one token (index 0); index 1 would score none
        with pytest.raises(ValueError, match="nll_from"):
            generate(model, PROMPTS, _cond(model, config), params, nll_from=bad)


def test_different_states_give_different_tokens(model: SIAModel, config: ModelConfig) -> None:
    sharpen(model)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=0)
    prompt = [PROMPTS[0]] * 3
    out = generate(model, prompt, _cond(model, config), params)
    # same seed and prompt, different identities: at least one pair of rows diverges
    assert len({tuple(g.tokens) for g in out}) > 1


def test_stream_events_concatenate_to_the_text(model: SIAModel, config: ModelConfig) -> None:
    params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=2)
    decoding = stream(model, PROMPTS[:2], _cond(model, config, 2), params)
    events = list(decoding)
    results = decoding.result
    for row in range(2):
        row_events = [e for e in events if e.row == row]
        assert [e.token for e in row_events] == results[row].tokens
        assert "".join(e.text for e in row_events) == results[row].text
        assert results[row].finish_reason in ("stop", "length")
        assert len(results[row].tokens) <= 40


def test_stop_strings_cut_the_text_and_are_never_streamed(model: SIAModel, config: ModelConfig) -> None:
    base = SamplingParams(max_new_tokens=48, temperature=0.0)
    full = generate(model, PROMPTS[:1], _cond(model, config, 1), base)[0]
    text = full.text
    assert len(text) >= 6, "the untrained model produces enough text to cut"
    stop = text[3:5]
    params = SamplingParams(max_new_tokens=48, temperature=0.0, stop=(stop,))
    decoding = stream(model, PROMPTS[:1], _cond(model, config, 1), params)
    streamed = "".join(event.text for event in decoding)
    result = decoding.result
    assert result[0].text == text[: text.find(stop)]
    assert streamed == result[0].text and stop not in streamed
    assert result[0].finish_reason == "stop"


def test_end_token_stops_and_specials_are_banned(model: SIAModel, config: ModelConfig) -> None:
    tok = ByteTokenizer()

    def favour_specials(module: torch.nn.Module, args: object, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[..., tok.user_id] += 100.0  # banned: must never be sampled
        logits[..., tok.pad_id] += 100.0
        logits[..., 0] += 100.0  # the NUL byte: no text contains it
        logits[..., tok.end_id] += torch.linspace(-50, 50, logits.shape[1])  # likely only late in a sequence
        return logits

    handle = model.lm_head.register_forward_hook(favour_specials)
    try:
        out = generate(model, PROMPTS[:1], _cond(model, config, 1), SamplingParams(max_new_tokens=10, temperature=0.0))[0]
    finally:
        handle.remove()
    assert out.tokens[-1] == tok.end_id and out.finish_reason == "stop"
    assert tok.user_id not in out.tokens and tok.pad_id not in out.tokens and 0 not in out.tokens


def test_sampling_filters() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9])
    g = torch.Generator().manual_seed(0)
    assert sample_next(logits, SamplingParams(temperature=0.0), None) == 1
    assert {sample_next(logits, SamplingParams(top_k=1), g) for _ in range(20)} == {1}
    assert {sample_next(logits, SamplingParams(top_p=1e-6), g) for _ in range(20)} == {1}
    picked = {sample_next(logits, SamplingParams(top_k=2), g) for _ in range(200)}
    assert picked == {1, 3}
    # probabilities are (.024, .479, .065, .433): top_p keeps the smallest set whose mass reaches p
    assert {sample_next(logits, SamplingParams(top_p=0.9), g) for _ in range(400)} == {1, 3}
    assert {sample_next(logits, SamplingParams(top_p=0.95), g) for _ in range(400)} == {1, 2, 3}


def test_a_sampled_token_follows_the_filtered_distribution() -> None:
    """The draw among the kept tokens only: 40 000 seeded draws land on each token within 4 standard deviations of
    its probability after temperature and top-p, and never on a dropped one."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -1.0, -5.0, float("-inf")])
    params = SamplingParams(temperature=0.8, top_p=0.95)
    scaled = (logits.double() - 2.0) / 0.8
    exact = torch.softmax(nucleus_reference(scaled, 0.95), -1)
    assert int((exact > 0).sum()) == 4  # two finite tokens dropped by top-p, one banned
    g = torch.Generator().manual_seed(11)
    n = 40_000
    share = torch.bincount(torch.tensor([sample_next(logits, params, g) for _ in range(n)]), minlength=7).double() / n
    assert bool((share[exact == 0] == 0).all())
    sd = (exact * (1 - exact) / n).sqrt()
    assert bool(((share - exact).abs() <= 4 * sd + 1e-12).all()), (share, exact)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"stop": ("",)}, "stop"),
        ({"repetition_penalty": 0.9}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"no_repeat_ngram": -1}, "no_repeat_ngram"),
        ({"no_repeat_ngram": 2.0}, "no_repeat_ngram"),
        ({"lowercase": 1}, "lowercase"),
        ({"max_sentences": -1}, "max_sentences"),
        ({"max_sentences": True}, "max_sentences"),
    ],
)
def test_bad_params_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_bad_requests_raise(model: SIAModel, config: ModelConfig) -> None:
    with pytest.raises(ValueError, match="context of"):
        generate(model, [[1] * 100], _cond(model, config, 1), SamplingParams(max_new_tokens=64))
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [[]], _cond(model, config, 1), SamplingParams())
    with pytest.raises(ValueError, match="conditioning has"):
        generate(model, PROMPTS, _cond(model, config, 1), SamplingParams())


def test_logprobs_describe_the_distribution_sampled_from(model: SIAModel, config: ModelConfig) -> None:
    params = SamplingParams(max_new_tokens=6, temperature=0.0, top_logprobs=5)
    events = list(stream(model, PROMPTS[:1], _cond(model, config, 1), params))
    assert len(events) == 6
    for e in events:
        ids = [t for t, _ in e.top_logprobs]
        values = [v for _, v in e.top_logprobs]
        assert len(ids) == 5 and values == sorted(values, reverse=True)
        assert ids[0] == e.token and values[0] == e.logprob  # greedy picks the most likely token
        assert e.logprob <= 0 and sum(math.exp(v) for v in values) <= 1 + 1e-5
    assert not SamplingParams().top_logprobs
    with pytest.raises(ValueError, match="top_logprobs"):
        SamplingParams(top_logprobs=21)


@pytest.mark.parametrize("temperature", [1e-3, 1e-30, 1e-300, 5e-324, 5.0])
def test_extreme_temperatures_sample_a_valid_token(temperature: float) -> None:
    logits = torch.tensor([0.0, 30.0, 1.0, float("-inf"), -50.0])
    g = torch.Generator().manual_seed(0)
    picks = {sample_next(logits, SamplingParams(temperature=temperature), g) for _ in range(50)}
    assert 3 not in picks  # a banned token never comes back
    if temperature < 1e-2:
        assert picks == {1}  # a near-zero temperature is greedy, not a NaN


def test_a_vanishing_top_p_keeps_the_most_likely_token() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0])
    g = torch.Generator().manual_seed(0)
    for top_k in (None, 1):
        assert {sample_next(logits, SamplingParams(top_p=5e-324, top_k=top_k), g) for _ in range(20)} == {1}


@pytest.mark.parametrize("vocab", [2, 5, NUCLEUS_FIRST, 1000, 49_152])
def test_the_nucleus_is_the_one_a_full_sort_finds(vocab: int) -> None:
    """``nucleus`` looks among the most likely tokens first and widens the search only while it must: the kept set is
    the full sort's, from sharp to flat distributions (where it has to widen to the whole vocabulary), with banned
    (-inf) tokens, at any top_p."""
    g = torch.Generator().manual_seed(vocab)
    widened = False
    for scale in (0.05, 1.0, 4.0, 12.0):
        for temperature in (0.4, 1.0):
            logits = (torch.randn(vocab, generator=g, dtype=torch.float64) * scale).clone()
            logits[torch.randint(0, vocab, (max(1, vocab // 50),), generator=g)] = float("-inf")
            logits[int(torch.randint(0, vocab, (1,), generator=g))] = 0.5  # at least one finite logit
            logits = (logits - logits.max()) / temperature  # as sample_next gives it
            for top_p in (5e-324, 0.1, 0.5, 0.9, 0.99, 0.999999):
                fast, slow = nucleus(logits, top_p), nucleus_reference(logits, top_p)
                assert torch.equal(fast.isinf(), slow.isinf()), (scale, temperature, top_p)
                assert torch.equal(fast[~fast.isinf()], logits[~fast.isinf()])
                widened |= int((~fast.isinf()).sum()) > NUCLEUS_FIRST
    assert widened or vocab <= NUCLEUS_FIRST  # the flat cases needed more than the first look


def _repeats_an_ngram(tokens: list[int], n: int) -> bool:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_generated_tokens() -> None:
    logits = torch.tensor([4.0, -2.0, 1.0, 3.0, float("-inf")])
    out = penalize(logits, [0, 1, 1, 4], SamplingParams(repetition_penalty=2.0))
    assert out.tolist() == [2.0, -4.0, 1.0, 3.0, float("-inf")]
    assert torch.equal(penalize(logits, [], SamplingParams(repetition_penalty=2.0)), logits)  # the prompt never counts
    # greedy applies it: token 0 (4.0) is pushed below token 3 (3.0) once generated
    assert sample_next(logits, SamplingParams(temperature=0.0), None, [0]) == 0
    assert sample_next(logits, SamplingParams(temperature=0.0, repetition_penalty=2.0), None, [0]) == 3


def test_no_repeat_ngram_bans_exactly_the_tokens_that_would_repeat_an_ngram() -> None:
    generated = [1, 2, 3, 1, 2, 4, 1, 2]
    assert repeated_ngram_bans(generated, 0) == []
    assert repeated_ngram_bans(generated, 1) == [1, 2, 3, 4]
    assert repeated_ngram_bans(generated, 2) == [3, 4]  # the last token, 2, was followed by 3 and by 4
    assert repeated_ngram_bans([1, 2, 3, 1], 2) == [2]
    assert repeated_ngram_bans(generated, 3) == [3, 4]  # (1, 2) was followed by 3 and by 4
    assert repeated_ngram_bans(generated, 4) == []
    assert repeated_ngram_bans([5, 5], 3) == []  # shorter than an n-gram
    logits = torch.tensor([0.0, 1.0, 2.0, 9.0, 8.0, 3.0])
    params = SamplingParams(temperature=0.0, no_repeat_ngram=3)
    assert sample_next(logits, params, None, generated) == 5  # 3 and 4 banned, greedy takes the next best
    assert sample_next(logits, SamplingParams(temperature=0.0), None, generated) == 3


def test_sampling_choices_carry_the_repetition_controls_over_the_defaults() -> None:
    defaults = SamplingParams(repetition_penalty=1.3, no_repeat_ngram=4)
    assert Sampling().over(defaults).repetition_penalty == 1.3 and Sampling().over(defaults).no_repeat_ngram == 4
    chosen = Sampling(repetition_penalty=1.0, no_repeat_ngram=0).over(defaults)
    assert chosen.repetition_penalty == 1.0 and chosen.no_repeat_ngram == 0
    with pytest.raises(ValueError, match="repetition_penalty"):
        Sampling(repetition_penalty=0.5)


def test_frequency_and_presence_penalties_subtract_per_count_and_once_as_openai_defines_them() -> None:
    logits = torch.tensor([4.0, -2.0, 1.0, 3.0])
    out = penalize(logits, [0, 0, 0, 1], SamplingParams(frequency_penalty=0.5, presence_penalty=0.25))
    assert out.tolist() == [4.0 - 1.5 - 0.25, -2.0 - 0.5 - 0.25, 1.0, 3.0]
    favoured = penalize(logits, [0, 2], SamplingParams(frequency_penalty=-1.0))  # a negative penalty favours repeats
    assert favoured.tolist() == [5.0, -2.0, 2.0, 3.0]
    assert torch.equal(penalize(logits, [], SamplingParams(frequency_penalty=2.0, presence_penalty=2.0)), logits)
    assert sample_next(logits, SamplingParams(temperature=0.0, presence_penalty=1.5), None, [0]) == 3
    for name in ("frequency_penalty", "presence_penalty"):
        with pytest.raises(ValueError, match=name):
            SamplingParams(**{name: 2.5})


def test_a_logit_bias_is_added_to_its_tokens_at_every_step_and_checked() -> None:
    logits = torch.tensor([4.0, -2.0, 1.0, 3.0])
    params = SamplingParams(temperature=0.0, logit_bias=((2, 5.0), (0, -100.0)))
    assert penalize(logits, [], params).tolist() == [-96.0, -2.0, 6.0, 3.0]
    assert sample_next(logits, params, None) == 2
    assert sample_next(logits, SamplingParams(temperature=0.0, logit_bias=((0, -100.0),)), None) == 3  # a ban
    with pytest.raises(ValueError, match="vocabulary has 4"):
        penalize(logits, [], SamplingParams(logit_bias=((4, 1.0),)))
    with pytest.raises(ValueError, match=r"\[-100, 100\]"):
        SamplingParams(logit_bias=((1, 101.0),))
    with pytest.raises(ValueError, match="token ids"):
        SamplingParams(logit_bias=((-1, 1.0),))
    with pytest.raises(ValueError, match="at most 300"):
        SamplingParams(logit_bias=tuple((i, 1.0) for i in range(301)))
    chosen = Sampling(logit_bias=((1, 2.0),), presence_penalty=0.5).over(SamplingParams(logit_bias=((3, 1.0),)))
    assert chosen.logit_bias == ((1, 2.0),) and chosen.presence_penalty == 0.5
    assert Sampling().over(SamplingParams(logit_bias=((3, 1.0),), frequency_penalty=0.2)).logit_bias == ((3, 1.0),)


def test_a_logit_bias_once_holds_only_until_the_reply_holds_its_token() -> None:
    """With logit_bias_once a pair's bias drops out once its token is in the reply; the other pairs keep theirs."""
    logits = torch.tensor([4.0, -2.0, 1.0, 3.0])
    params = SamplingParams(temperature=0.0, logit_bias=((2, 5.0), (1, 1.0)), logit_bias_once=True)
    assert penalize(logits, [], params).tolist() == [4.0, -1.0, 6.0, 3.0]
    assert penalize(logits, [3, 2], params).tolist() == [4.0, -1.0, 1.0, 3.0]  # said once: token 2 is the model's again
    assert penalize(logits, [2, 1], params).tolist() == logits.tolist()
    assert sample_next(logits, params, None, []) == 2 and sample_next(logits, params, None, [2]) == 0
    always = SamplingParams(temperature=0.0, logit_bias=((2, 5.0),))
    assert sample_next(logits, always, None, [2]) == 2  # without it the bias holds at every step
    assert Sampling().over(params).logit_bias_once and not Sampling(logit_bias_once=False).over(params).logit_bias_once
    with pytest.raises(ValueError, match="logit_bias_once must be true or false"):
        SamplingParams(logit_bias_once=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [0.0, 0.1])
def test_repetition_controls_hold_in_decoding_and_batched_rows_equal_solo_rows(
    model: SIAModel, config: ModelConfig, temperature: float
) -> None:
    """Each row's controls read its own reply only: batched rows of different lengths give what each gives alone, with
    and without the cache, and no row repeats a 3-gram (which the same decoding without the ban does)."""
    plain = SamplingParams(max_new_tokens=40, temperature=temperature, seed=3)
    controlled = SamplingParams(
        max_new_tokens=40,
        temperature=temperature,
        seed=3,
        repetition_penalty=1.3,
        no_repeat_ngram=3,
        frequency_penalty=0.3,
        presence_penalty=0.2,
        logit_bias=((ord("e"), 1.5),),
    )
    loose = generate(model, PROMPTS, _cond(model, config), plain)
    assert any(_repeats_an_ngram(g.tokens, 3) for g in loose)  # the tiny model loops: the ban has work to do
    batched = generate(model, PROMPTS, _cond(model, config), controlled)
    uncached = generate(model, PROMPTS, _cond(model, config), controlled, use_cache=False)
    assert [g.tokens for g in batched] == [g.tokens for g in uncached]
    states = [IdentityState.fresh(config), random_state(config, 1), random_state(config, 2)]
    for b, row in enumerate(batched):
        solo = generate(model, [PROMPTS[b]], model.condition_states([states[b]]), controlled)[0]
        assert solo.tokens == row.tokens
        assert not _repeats_an_ngram(row.tokens, 3), row.tokens
    assert [g.tokens for g in batched] != [g.tokens for g in loose]


@pytest.mark.parametrize(
    "text,n,end",
    [
        ("paris.", 1, None),  # no white space yet: "3.5" could still follow
        ("paris. the", 1, 6),
        ("Yes! It is.\nMore", 1, 4),
        ("Yes! It is.\nMore", 2, 11),
        ('He said "go." Then', 1, 13),
        ("3.5 is a number", 1, None),
        ("Wait... what? ok", 2, 13),
    ],
)
def test_sentences_end_after_the_closing_marks_once_white_space_follows(text: str, n: int, end: int | None) -> None:
    assert sentences_end(text, n) == end


def test_a_lowercase_reply_is_the_same_decoding_written_in_lower_case(model: SIAModel, config: ModelConfig) -> None:
    """The tiny byte model, made to like capitals, decodes the same tokens with and without the rule; with it the text
    (whole, and as streamed) is that text in lower case, and a stop string is found in either case."""
    bias = torch.zeros(config.vocab_size)
    bias[ord("A") : ord("Z") + 1] = 4.0
    liked = _biased_head(model, bias)
    free = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5)
    lower = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5, lowercase=True)
    loose = generate(liked, PROMPTS, _cond(liked, config), free)
    assert any(c.isupper() for g in loose for c in g.text)
    kept = generate(liked, PROMPTS, _cond(liked, config), lower)
    events = list(stream(liked, PROMPTS, _cond(liked, config), lower))
    for b, (g, want) in enumerate(zip(kept, loose, strict=True)):
        assert g.tokens == want.tokens and g.text == want.text.lower() and not any(c.isupper() for c in g.text)
        assert "".join(e.text for e in events if e.row == b) == g.text
    word = next(g.text for g in loose if len(g.text) > 8)[3:6]  # a piece of a reply, capitals and all
    stopped = generate(liked, PROMPTS, _cond(liked, config), replace(lower, stop=(word,)))
    assert any(g.finish_reason == "stop" and len(g.text) < len(w.text) for g, w in zip(stopped, kept, strict=True))
    assert lowered("ΟΔΟΣ Σ") == "οδοσ σ" and lowered("ABC", False) == "ABC"


def test_a_reply_not_in_lower_case_opens_with_a_capital(model: SIAModel, config: ModelConfig) -> None:
    """The tiny byte model, made to like lower-case letters, decodes the same tokens either way; a reply not written
    in lower case has its first letter a capital where it opens with a word in lower case (whole, and as streamed), the
    rest of its text as decoded."""
    bias = torch.zeros(config.vocab_size)
    bias[ord("a") : ord("z") + 1] = 6.0
    liked = _biased_head(model, bias)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    replies = generate(liked, PROMPTS, _cond(liked, config), params)
    events = list(stream(liked, PROMPTS, _cond(liked, config), params))
    lower = generate(liked, PROMPTS, _cond(liked, config), replace(params, lowercase=True))
    decoded = [ByteTokenizer().decode(g.tokens).lstrip() for g in replies]
    assert any(text[:1].islower() for text in decoded)
    for b, (g, text) in enumerate(zip(replies, decoded, strict=True)):
        assert g.text == capitalised(text) and not g.text[:1].islower()
        assert "".join(e.text for e in events if e.row == b) == g.text
        assert lower[b].tokens == g.tokens and lower[b].text == text.lower()
    assert capitalised("green, I'd guess") == "Green, I'd guess"
    assert capitalised("iPhone first") == "iPhone first" and capitalised("3 apples") == "3 apples"
    assert capitalised("ßig") == "ßig" and capitalised("") == "" and capitalised("été") == "Été"


def test_a_sentence_limit_ends_the_reply_after_its_last_sentence(model: SIAModel, config: ModelConfig) -> None:
    """The tiny model, made to like full stops and spaces, is cut after its first sentence: the text ends with the
    stop, the token that began the next sentence is the last one decoded, and the streamed text is the text."""
    bias = torch.zeros(config.vocab_size)
    bias[[ord("."), ord(" ")]] = 6.0
    liked = _biased_head(model, bias)
    free = SamplingParams(max_new_tokens=40, temperature=1.0, seed=2)
    one = SamplingParams(max_new_tokens=40, temperature=1.0, seed=2, max_sentences=1)
    loose = generate(liked, PROMPTS, _cond(liked, config), free)
    assert any(sentences_end(g.text, 2) is not None for g in loose)
    events = list(stream(liked, PROMPTS, _cond(liked, config), one))
    cut = generate(liked, PROMPTS, _cond(liked, config), one)
    for b, g in enumerate(cut):
        assert "".join(e.text for e in events if e.row == b) == g.text
        if g.finish_reason == "stop" and g.tokens[-1] not in ByteTokenizer.end_ids:
            end = sentences_end(g.text + ByteTokenizer().decode(g.tokens[-1:]), 1)
            assert end == len(g.text) and g.text.rstrip() == g.text
            assert ByteTokenizer().decode(g.tokens[:-1]).lstrip() == g.text
    assert sum(g.finish_reason == "stop" and g.tokens[-1] not in ByteTokenizer.end_ids for g in cut) >= 2


def test_sampling_choices_carry_the_form_over_the_defaults() -> None:
    defaults = SamplingParams(lowercase=True, max_sentences=2, exclaim=True)
    kept = Sampling().over(defaults)
    assert kept.lowercase and kept.max_sentences == 2 and kept.exclaim
    chosen = Sampling(lowercase=False, max_sentences=0, exclaim=False).over(defaults)
    assert not chosen.lowercase and chosen.max_sentences == 0 and not chosen.exclaim
    with pytest.raises(ValueError, match="exclaim"):
        SamplingParams(exclaim=1)  # type: ignore[arg-type]


def test_exclaimed_moves_the_full_stops_probability_onto_its_exclamation_twin() -> None:
    logits = torch.tensor([0.5, 2.0, -1.0, 1.0, 0.0, 3.0])
    pairs = [(1, 3), (4, 2)]  # (full stop, exclamation)
    p, q = torch.softmax(logits, -1), torch.softmax(exclaimed(logits, pairs), -1)
    assert torch.allclose(q[3], p[1] + p[3]) and torch.allclose(q[2], p[4] + p[2])
    assert q[1] == 0 and q[4] == 0 and torch.allclose(q[[0, 5]], p[[0, 5]])
    assert exclaimed(logits, []) is logits
    assert exclamation_pairs(ByteTokenizer()) == ((ord("."), ord("!")),)  # '."' and the like are two byte tokens


def test_an_exclaiming_reply_ends_its_first_sentence_after_a_word_with_an_exclamation_mark() -> None:
    """The row picks "!" where the model's likeliest token is a full stop right after a word, until the reply holds a
    "!"; a full stop after a digit (3.5, a list's "1.") or after the first "!" is left to the model."""
    tok, cpu = ByteTokenizer(), torch.device("cpu")
    params = SamplingParams(temperature=0.0, exclaim=True)
    stop = torch.full((tok.vocab_size,), -5.0)
    stop[ord(".")] = 5.0
    for text, want in [("Paris", "!"), ("It is 3", "."), ("Yes! It is Paris", "."), ("", ".")]:
        row = ReplyDecoder(params, cpu, tok)
        for t in text.encode():
            row.push(t, params, tok.end_ids)
        assert chr(row.sample(stop, params)) == want, text
    plain = ReplyDecoder(replace(params, exclaim=False), cpu, tok)
    for t in b"Paris":
        plain.push(t, params, tok.end_ids)
    assert chr(plain.sample(stop, params)) == "."


def test_an_address_comes_before_the_first_sentence_end_after_a_word_unless_the_reply_says_it() -> None:
    """Where the row picks a sentence's end right after a word, the address's tokens come first and then that end;
    after a digit, once the reply says the address's words (in any case), or with no address, the end comes at once."""
    tok, cpu = ByteTokenizer(), torch.device("cpu")
    params = SamplingParams(temperature=0.0, address=", sir")
    stop = torch.full((tok.vocab_size,), -5.0)
    stop[ord("?")] = 5.0

    def reply(text: str, p: SamplingParams, steps: int) -> str:
        row = ReplyDecoder(p, cpu, tok)
        for t in text.encode():
            row.push(t, p, tok.end_ids)
        for _ in range(steps):
            row.push(row.sample(stop, p), p, tok.end_ids)
        return row.text

    assert reply("Is it Tokyo", params, 6) == "Is it Tokyo, sir?"
    assert reply("Is it 3", params, 1) == "Is it 3?"
    assert reply("Yes, Sir, is it Tokyo", params, 1) == "Yes, Sir, is it Tokyo?"
    assert reply("A sirloin", params, 6) == "A sirloin, sir?"  # "sirloin" is not the word
    assert reply("Is it Tokyo", replace(params, address=""), 1) == "Is it Tokyo?"
    for bad in ("\n", ", 42", "x" * 41):
        with pytest.raises(ValueError, match="address"):
            SamplingParams(address=bad)
    assert Sampling(address="").over(params).address == "" and Sampling().over(params).address == ", sir"


def _picked_after(text: str, params: SamplingParams, scores: torch.Tensor) -> str:
    """The byte tokenizer's next token, as a character ("<end>" for the end token the tests raise), that a reply which
    has written ``text`` picks from ``scores`` under ``params``."""
    tok = ByteTokenizer()
    row = ReplyDecoder(params, torch.device("cpu"), tok)
    for t in text.encode():
        row.push(t, params, tok.end_ids)
    token = row.sample(scores, params)
    return "<end>" if token == next(iter(tok.end_ids)) else chr(token)


def test_a_word_limit_pulls_the_replys_end_nearer_at_every_word_past_it_and_never_cuts_a_word() -> None:
    """Past ``max_words`` - 1 words a sentence closer gains END_PULL nats a word where the model's likeliest token
    begins a new word, and the end token does right after a closer; inside a word (a letter or an apostrophe next),
    right after a word a sentence cannot end on ("in", "a", "The"), below the limit or with the limit off, the model's
    own pick stands."""
    tok = ByteTokenizer()
    params = SamplingParams(temperature=0.0, max_words=3)
    logits = torch.full((tok.vocab_size,), -9.0)
    logits[ord(" ")], logits[ord("e")], logits[ord(".")] = 4.0 + END_PULL / 2, 3.0, 0.0
    logits[next(iter(tok.end_ids))] = 0.0

    def pick(text: str, p: SamplingParams = params, scores: torch.Tensor = logits) -> str:
        return _picked_after(text, p, scores)

    assert pick("one two") == " "  # below the limit
    assert pick("one two three") == " "  # one word past limit - 1: the closer gains END_PULL, short of the space
    assert pick("one two three four five") == "."  # three: 3 * END_PULL
    assert pick("one two three four five", replace(params, max_words=0)) == " "
    inside = logits.clone()
    inside[ord("e")] = 6.0  # the model's likeliest token goes on with the word
    assert pick("one two three four fiv", scores=inside) == "e"
    apostrophe = logits.clone()
    apostrophe[ord("'")] = 6.0  # "night" + "'s"
    assert pick("one two three four night", scores=apostrophe) == "'"
    assert pick("one two three four five.") == "<end>"  # after a closer the end token gains
    assert pick("one two three four five 12") == "."  # a number is a word's end too
    for open_word in ("in", "a", "The", "with", "of"):
        assert pick(f"one two three four found {open_word}") == " "  # "... found in." cannot end there
    assert pick("one two three four tin") == pick("one two three four plain") == "."  # whole words: "tin" is not "in"
    assert Sampling().over(params).max_words == 3 and Sampling(max_words=0).over(params).max_words == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_words"):
            SamplingParams(max_words=bad)  # type: ignore[arg-type]


def test_a_wind_down_pulls_the_replys_end_nearer_at_every_token_of_its_last_n() -> None:
    """In the last ``wind_down`` tokens before ``max_new_tokens`` (a quarter of the limit at most) a sentence closer
    gains WIND_PULL nats for each token into them, at a word's end as a word limit pulls it (never inside a word, nor
    after a word a sentence cannot end on), and the end token does right after a closer; before those tokens, or with
    it off, the model's pick stands. Where a word limit pulls too, the larger pull holds."""
    tok = ByteTokenizer()
    params = SamplingParams(temperature=0.0, max_new_tokens=40, wind_down=8)
    logits = torch.full((tok.vocab_size,), -9.0)
    logits[ord(" ")], logits[ord("e")], logits[ord(".")] = 2.0 * WIND_PULL, 1.0, 0.0
    logits[next(iter(tok.end_ids))] = -0.5

    def pick(text: str, p: SamplingParams = params, scores: torch.Tensor = logits) -> str:
        return _picked_after(text, p, scores)

    words = "aa bb cc dd ee ff gg hh ii jj kk"  # 32 tokens: the 33rd is the first of the last 8
    assert len(words) == 32
    assert pick(words[:-3]) == " "  # before the last 8 tokens: the model's pick
    assert pick(words) == " "  # the first of them: the closer gains WIND_PULL, short of the space
    assert pick(words + " ll") == "."  # the fourth: 4 * WIND_PULL
    assert pick(words + " ll", replace(params, wind_down=0)) == " "
    assert pick(words + " ll", replace(params, max_new_tokens=60)) == " "  # far from a longer limit
    short = replace(params, max_new_tokens=12)  # a quarter of the limit at most: its last 3 tokens, not 8
    assert pick("aa bb cc", short) == " " and pick("aa bb cc dd", short) == "."  # 3 * WIND_PULL at its 12th token
    assert WIND_SHARE == 4 and pick("aa", replace(params, max_new_tokens=3)) == " "  # a quarter of 3: none
    inside = logits.clone()
    inside[ord("e")] = 9.0  # the model goes on with the word
    assert pick(words + " ll", scores=inside) == "e"
    assert pick(words + " in") == " "  # "... in." cannot end there
    assert pick(words + " l.") == "<end>"  # after a closer the end token gains
    assert pick("one two three", replace(params, max_words=3)) == "."  # before the last 8: the word limit's own pull
    assert pick(words + " ll", replace(params, max_words=200)) == "."  # a word limit far off: the wind-down's pull
    assert Sampling().over(params).wind_down == 8 and Sampling(wind_down=0).over(params).wind_down == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="wind_down"):
            SamplingParams(wind_down=bad)  # type: ignore[arg-type]


def _wordy(model: SIAModel, config: ModelConfig) -> SIAModel:
    """The tiny model made to like letters and spaces far above full stops and the end token: its replies run on."""
    bias = torch.zeros(config.vocab_size)
    bias[ord("a") : ord("z") + 1] = 10.0
    bias[ord(" ")] = 11.0
    bias[[ord("."), *ByteTokenizer.end_ids]] = 6.0
    return _biased_head(model, bias)


def test_a_wind_down_ends_replies_the_token_limit_would_cut(model: SIAModel, config: ModelConfig) -> None:
    """The tiny model, made to like letters and spaces far above full stops and the end token, sampled to 96 tokens:
    without a wind-down every reply runs into the limit; with the last 24 tokens winding down, every reply ends at a
    full stop first, and each is the same as without it up to the wind-down's first token."""
    liked = _wordy(model, config)
    params = SamplingParams(max_new_tokens=96, temperature=1.0, seed=5, wind_down=24)
    wound = generate(liked, PROMPTS, _cond(liked, config), params)
    free = generate(liked, PROMPTS, _cond(liked, config), replace(params, wind_down=0))
    assert all(g.finish_reason == "length" for g in free), [g.text for g in free]
    assert all(g.finish_reason == "stop" and g.text.rstrip()[-1:] == "." for g in wound), [g.text for g in wound]
    assert all(w.tokens[:72] == f.tokens[:72] for w, f in zip(wound, free, strict=True))


def test_a_word_limit_shortens_a_sampled_decoding(model: SIAModel, config: ModelConfig) -> None:
    """The tiny model, made to like letters and spaces far above full stops and the end token, sampled with a limit of
    three words: every reply ends, after fewer tokens than the same seeds give without it."""
    liked = _wordy(model, config)
    params = SamplingParams(max_new_tokens=64, temperature=1.0, seed=5, max_words=3)
    limited = generate(liked, PROMPTS, _cond(liked, config), params)
    free = generate(liked, PROMPTS, _cond(liked, config), replace(params, max_words=0))
    assert all(g.finish_reason == "stop" for g in limited), [g.text for g in limited]
    assert sum(len(g.tokens) for g in limited) < sum(len(g.tokens) for g in free)
    assert all(g.text.rstrip()[-1:] == "." for g in limited), [g.text for g in limited]


def test_an_exclaiming_decoding_ends_its_first_sentence_with_an_exclamation_mark(model: SIAModel, config: ModelConfig) -> None:
    """The tiny model, made to like letters, spaces and full stops, sampled: no full stop follows a word before a
    reply's first "!", and after it full stops are the model's again."""
    bias = torch.zeros(config.vocab_size)
    bias[ord("a") : ord("z") + 1] = 3.0
    bias[[ord("."), ord(" ")]] = 5.0
    liked = _biased_head(model, bias)
    params = SamplingParams(max_new_tokens=48, temperature=1.0, seed=3, exclaim=True)
    replies = [g.text for g in generate(liked, PROMPTS, _cond(liked, config), params)]
    free = [g.text for g in generate(liked, PROMPTS, _cond(liked, config), replace(params, exclaim=False))]
    assert not any("!" in text for text in free) and any(re.search(r"[a-z]\.", text) for text in free)
    for text in replies:
        head, _, _ = text.partition("!")
        assert not re.search(r"[a-z]\.", head), text
    assert sum("!" in text for text in replies) >= 2
    assert any(re.search(r"[a-z]\.", text.partition("!")[2]) for text in replies)  # once only


def _biased_head(model: SIAModel, bias: torch.Tensor) -> SIAModel:
    """A copy of ``model`` whose logits are moved by ``bias`` (V,)."""
    liked = copy.deepcopy(model)
    head = liked.lm_head
    if head.bias is None:
        head.bias = torch.nn.Parameter(bias.clone())
    else:
        with torch.no_grad():
            head.bias += bias
    return liked


def test_a_reply_begins_at_its_first_visible_character() -> None:
    """White space the model samples before anything else is not shown (" Lisbon" reads "Lisbon"); the tokens stay the
    model's, white space later in the reply stays, and a stop string is not met by the leading white space."""
    tok = ByteTokenizer()
    row = ReplyDecoder(SamplingParams(temperature=0.0, stop=("\n",)), torch.device("cpu"), tok)
    deltas = [row.push(t, SamplingParams(temperature=0.0), tok.end_ids) for t in b"\n  Hi there"]
    assert row.text == "Hi there" and "".join(deltas) == "Hi there" and deltas[:3] == ["", "", ""]
    assert row.tokens == list(b"\n  Hi there") and row.finish_reason is None
    assert row.push(ord("\n"), SamplingParams(temperature=0.0), tok.end_ids) == "" and row.finish_reason == "stop"
    blank = ReplyDecoder(SamplingParams(temperature=0.0, max_new_tokens=2), torch.device("cpu"), tok)
    assert [blank.push(t, SamplingParams(max_new_tokens=2), tok.end_ids) for t in b"  "] == ["", ""]
    assert blank.text == "" and blank.finish_reason == "length"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_likeliest_is_argmax_with_the_first_of_tied_logits(dtype: torch.dtype) -> None:
    """``likeliest`` (greedy decoding's and the copy read's pick) gives argmax's index, the first of a tie, in every
    row of a batch of logits and for one row's (V,) logits."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (8, 3, 1000), generator=g).to(dtype)  # many ties among the largest
    picked = likeliest(logits)
    assert picked.shape == (8, 3) and torch.equal(picked, logits.argmax(-1))
    row = torch.zeros(1000, dtype=dtype)
    row[[17, 400, 999]] = 2.0
    assert int(likeliest(row)) == 17
