"""Continuous batching (sia.model.batching): rows of different identities joining at different steps, leaving when they
stop or are cancelled, each decode exactly as it would alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

import sia.backbones.llama as llama_module
import sia.model.generate as generate_module
from sia.backbones.injected_attention import row_starts
from sia.backbones.llama import LlamaModel
from sia.backbones.packed_linear import NO_BFLOAT16_PACKING, bfloat16_packing_available, packing_available
from sia.identity.imprint import Imprint, SpanChoice, imprint_spans
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, conclude_turns, run_turn, turn_prompt
from sia.model.batching import DecodeBatch
from sia.model.config import LlamaConfig
from sia.model.generate import Generation, SamplingParams, generate
from sia.model.identity_model import IdentityModel
from sia.model.kv_cache import KVCache
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer
from tests.conftest import tiny_config

from .test_llama import HF_TINY, open_read, random_state


def llama(memory_tokens: int, slots: int) -> LlamaModel:
    torch.manual_seed(0)
    hf = LlamaForCausalLM(HFLlamaConfig(**HF_TINY)).eval()
    config = LlamaConfig.from_hf(HF_TINY, d_self=8, trace_layers=[0, 2], memory_tokens=memory_tokens, self_slots=slots)
    model = LlamaModel(config, ByteTokenizer()).eval()
    model.load_base(hf.state_dict())
    return open_read(model)


def packed(model: LlamaModel, dtype: torch.dtype = torch.float32) -> LlamaModel:
    """The model with its matrices packed, as the service runs it on a CPU (float32: three rows or more through
    oneDNN; bfloat16: every projection)."""
    if dtype == torch.bfloat16 and not bfloat16_packing_available():
        pytest.skip(NO_BFLOAT16_PACKING)
    if packing_available():
        model.pack_weights(dtype)
    return model


def native() -> SIAModel:
    torch.manual_seed(1)
    return SIAModel(tiny_config(block_size=256)).eval()


def states(model: IdentityModel, n: int) -> list[IdentityState]:
    out = []
    for i in range(n):
        state = random_state(model.config, 10 + i) if isinstance(model, LlamaModel) else IdentityState.fresh(model.config)
        if not isinstance(model, LlamaModel):  # a native state: a random trace and self state of its shapes
            g = torch.Generator().manual_seed(20 + i)
            state = IdentityState(
                trace=(torch.randn(model.config.trace_shape, generator=g) * 0.2).to(state.trace.dtype),
                self_state=torch.rand(model.config.d_self, generator=g) * 2 - 1,
                turns=3,
            )
        out.append(state)
    return out


def solo(model: IdentityModel, prompt: list[int], state: IdentityState, params: SamplingParams) -> Generation:
    (gen,) = generate(model, [prompt], model.condition_states([state]), params)
    return gen


PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51], [60, 61], [70, 71, 72, 73]]
PARAMS = [
    SamplingParams(max_new_tokens=7, temperature=0.0),
    SamplingParams(max_new_tokens=5, temperature=0.9, seed=3, top_k=20),
    SamplingParams(max_new_tokens=9, temperature=1.0, seed=4, top_p=0.9),
    SamplingParams(max_new_tokens=3, temperature=0.0),
]
JOIN_AT = [0, 2, 2, 5]  # the step before which each row joins: the longer second row widens the batch


@pytest.mark.parametrize("together", [False, True], ids=["prefilled-alone", "prefilled-together"])
@pytest.mark.parametrize(
    "build",
    [
        lambda: llama(0, 1),
        lambda: llama(2, 2),
        lambda: packed(llama(2, 2)),
        lambda: packed(llama(2, 2), torch.bfloat16),
        native,
    ],
    ids=["llama", "llama-memory-slots", "llama-packed", "llama-packed-bf16", "native"],
)
def test_rows_joining_at_different_steps_decode_as_they_would_alone(build: object, together: bool) -> None:
    """Rows 1 and 2 join at the same step: one by one, or (``together``) in one left-padded prefill."""
    model = build()  # type: ignore[operator]
    identity = states(model, len(PROMPTS))
    expected = [solo(model, p, s, q) for p, s, q in zip(PROMPTS, identity, PARAMS, strict=True)]
    batch, handles, sizes, texts = decode_joining(model, identity, together)
    assert max(sizes) >= 3  # rows really shared steps
    for i, want in enumerate(expected):
        got = batch.take(handles[i])
        assert got.tokens == want.tokens, i
        assert got.text == want.text == texts[i] and got.finish_reason == want.finish_reason
        torch.testing.assert_close(got.prompt_nll, want.prompt_nll, atol=1e-5, rtol=0)
        torch.testing.assert_close(got.stats.hidden, want.stats.hidden, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.stats.layer_inputs, want.stats.layer_inputs, atol=1e-4, rtol=1e-4)
        assert float(got.stats.count) == float(want.stats.count)


def wider_bfloat16(**overrides: object) -> LlamaModel:
    """A model big enough for the kernels' summation orders to differ with the rows, its weights packed in bfloat16
    (``exact_rows``)."""
    if not packing_available():
        pytest.skip("this torch build has no oneDNN to pack weights with")
    torch.manual_seed(0)
    wider = dict(HF_TINY, hidden_size=256, intermediate_size=768, head_dim=64, num_hidden_layers=2)
    hf = LlamaForCausalLM(HFLlamaConfig(**wider)).eval()
    config = LlamaConfig.from_hf(wider, d_self=32, trace_layers=[0, 1], memory_tokens=2, self_slots=2, **overrides)
    model = LlamaModel(config, ByteTokenizer()).eval()
    model.load_base(hf.state_dict())
    model = packed(open_read(model), torch.bfloat16)
    assert model.exact_rows
    return model


def assert_same_generation(got: Generation, want: Generation, label: object = None) -> None:
    """``got`` is ``want`` bit for bit: tokens, prompt NLL and every sum the turn's write reads (memory tokens included)."""
    assert got.tokens == want.tokens and torch.equal(got.prompt_nll, want.prompt_nll), label
    for name, value in vars(got.stats).items():
        assert value is None or torch.equal(value, getattr(want.stats, name)), (label, name)


def assert_bit_for_bit(model: LlamaModel, identity: list[IdentityState], together: bool, params: list[SamplingParams]) -> None:
    """Each of PROMPTS decoded with ``params`` joining one batch (``decode_joining``) is exactly the row alone, in a
    DecodeBatch of its own and through ``generate``: tokens, every step's log-probability, prompt NLL, the turn
    statistics and the summary its turn writes the state from."""
    expected, alone = [], []
    for p, s, q in zip(PROMPTS, identity, params, strict=True):
        one = DecodeBatch(model)
        handle = one.join(p, model.condition_states([s]), q)
        steps: list[float] = []
        while len(one):
            steps += [e.logprob for e in one.step()]
        alone.append(steps)
        expected.append(one.take(handle))
        plain = solo(model, p, s, q)  # generate: a cache of its own, nothing before the row's first token
        assert plain.tokens == expected[-1].tokens and torch.equal(plain.stats.hidden, expected[-1].stats.hidden)
    logprobs: dict[int, list[float]] = {}
    batch, handles, _, _ = decode_joining(model, identity, together, logprobs, params)
    for i, want in enumerate(expected):
        got = batch.take(handles[i])
        assert_same_generation(got, want, i)
        assert logprobs[handles[i]] == alone[i], i
        a, b = model.summarize(got.stats), model.summarize(want.stats)
        assert all(torch.equal(x, y) for x, y in zip(vars(a).values(), vars(b).values(), strict=True) if x is not None)


@pytest.mark.parametrize("together", [False, True], ids=["prefilled-alone", "prefilled-together"])
def test_with_bfloat16_packed_weights_a_batched_row_is_bit_for_bit_the_row_alone(together: bool) -> None:
    """``pack_weights(torch.bfloat16)``: every product is row-independent, the slots are computed row by row, padded
    rows attend one by one and a padded group is prefilled row by row, so a batched row's log-probabilities, prompt
    NLL, turn statistics and the summary its turn writes the state from are exactly (not nearly) the ones it computes
    alone; without that, bfloat16's coarser rounding turns the batch's different summation orders into other tokens."""
    model = wider_bfloat16()
    assert_bit_for_bit(model, states(model, len(PROMPTS)), together, PARAMS)


def counting_row_starts(monkeypatch: pytest.MonkeyPatch) -> list[list[int] | None]:
    """Every ``row_starts`` the model's forwards take from now on, in order (None: the rows attend through the mask)."""
    seen: list[list[int] | None] = []

    def counted(attn_mask: torch.Tensor, prefix: int) -> list[int] | None:
        seen.append(row_starts(attn_mask, prefix))
        return seen[-1]

    monkeypatch.setattr(llama_module, "row_starts", counted)
    return seen


@pytest.mark.parametrize("together", [False, True], ids=["prefilled-alone", "prefilled-together"])
def test_with_bfloat16_packed_weights_a_row_whose_reply_is_taken_back_is_bit_for_bit_the_row_alone(
    together: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply taken back forgets the tokens it read: alone, its cache drops them; in a batch, the row's earlier columns
    move over them, so its tokens stay one run of columns and it attends alone, as every row beside it, in every
    forward; each row is exactly what it is alone."""
    monkeypatch.setattr(generate_module, "foreign_opening", lambda opening, user, ended=False: True)
    seen = counting_row_starts(monkeypatch)
    model = wider_bfloat16()
    params = [replace(p, max_new_tokens=10) for p in PARAMS]
    for i in (0, 1):
        params[i] = replace(params[i], reply_to="Hi! I'm Ana Kowalski from Lisbon.")
    assert_bit_for_bit(model, states(model, len(PROMPTS)), together, params)
    assert len(seen) > 10 and all(starts is not None for starts in seen)  # never the batch's padding mask


def test_with_bfloat16_packed_weights_generate_of_several_rows_is_each_row_alone_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``generate`` of left-padded rows with ``exact_rows``: after the prefill each row's self slots are mirrored just
    before its first token (``KVCache.mirror``), so each row's keys are one view; every row, two of them taken back,
    is its solo run bit for bit (tokens, prompt NLL, the turn's sums)."""
    monkeypatch.setattr(generate_module, "foreign_opening", lambda opening, user, ended=False: True)
    mirrored: list[list[int]] = []
    mirror = KVCache.mirror

    def counted(cache: KVCache, firsts: list[int]) -> None:
        mirrored.append(list(firsts))
        mirror(cache, firsts)

    monkeypatch.setattr(KVCache, "mirror", counted)
    model = wider_bfloat16()
    identity = states(model, len(PROMPTS))
    params = [replace(p, max_new_tokens=10) for p in PARAMS]
    for i in (0, 1):
        params[i] = replace(params[i], reply_to="Hi! I'm Ana Kowalski from Lisbon.")
    alone = [solo(model, p, s, q) for p, s, q in zip(PROMPTS, identity, params, strict=True)]
    assert mirrored == []  # a row alone has nothing to mirror
    together = generate(model, PROMPTS, model.condition_states(identity), params)
    P, L = model.prefix_len, max(map(len, PROMPTS))
    assert mirrored == [[P + L - len(p) for p in PROMPTS]]
    for i, (want, got) in enumerate(zip(alone, together, strict=True)):
        assert_same_generation(got, want, i)


def test_with_bfloat16_packed_weights_generate_of_rows_that_stop_at_different_steps_is_each_row_alone_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows whose replies stop early leave empty columns behind them while the others decode on; before the memory
    tokens' write their columns close up over those (``closed_up``), so every row attends alone in that forward too,
    and the sums of a row that has stopped are kept as they are: each row is its solo run bit for bit."""
    seen = counting_row_starts(monkeypatch)
    model = wider_bfloat16()
    identity = states(model, len(PROMPTS))  # PARAMS: 7, 5, 9 and 3 tokens
    alone = [solo(model, p, s, q) for p, s, q in zip(PROMPTS, identity, PARAMS, strict=True)]
    seen.clear()
    together = generate(model, PROMPTS, model.condition_states(identity), PARAMS)
    assert len({len(g.tokens) for g in together}) > 1
    assert seen and all(starts is not None for starts in seen)  # the memory tokens' forward included
    for i, (want, got) in enumerate(zip(alone, together, strict=True)):
        assert_same_generation(got, want, i)


def test_with_bfloat16_packed_weights_a_row_copying_from_its_imprint_is_bit_for_bit_the_row_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The copy read's weights on the imprint's entries are computed row by row too, over each row's own keys (a reply
    taken back included): a batched row that copies is exactly the row alone."""
    monkeypatch.setattr(generate_module, "foreign_opening", lambda opening, user, ended=False: True)
    model = wider_bfloat16(imprint_tokens=24, imprint_span=16, imprint_min_shock=0.0, imprint_copy=4.0, imprint_copy_layers=[1])
    identity = []
    for i, (state, words) in enumerate(
        zip(states(model, len(PROMPTS)), ["Ana Kowalski", "Lisbon", "a nurse", "green"], strict=True)
    ):
        ids = model.tokenizer.encode(words)
        read = model.read_words(torch.tensor([ids]))
        imprint = imprint_spans(
            Imprint.empty(model.config),
            read.keys,
            read.values,
            [SpanChoice(0, len(ids), 5.0, i)],
            turn=0,
            tokens=torch.tensor(ids),
        )
        identity.append(replace(state, imprint=imprint))
    params = [replace(p, max_new_tokens=10) for p in PARAMS]
    params[0] = replace(params[0], reply_to="Hi! I'm Ana Kowalski from Lisbon.")
    plain = solo(model, PROMPTS[1], identity[1], params[1])
    uncopied = solo(model, PROMPTS[1], replace(identity[1], imprint=Imprint.empty(model.config)), params[1])
    assert plain.tokens != uncopied.tokens  # the imprint is really read
    assert_bit_for_bit(model, identity, True, params)


@pytest.mark.parametrize("build", [lambda: packed(llama(2, 2)), lambda: packed(llama(2, 2), torch.bfloat16), native])
def test_a_prefill_scored_from_a_start_gives_each_row_its_solo_scores(build: object) -> None:
    """Rows prefilled together with ``nll_from`` (different starts, left-padded) get the prompt NLL each gets alone
    with its start, NaN before it, and decode the same tokens as without it."""
    model = build()  # type: ignore[operator]
    identity = states(model, len(PROMPTS))
    starts = [3, 6, 0, 2]
    batch = DecodeBatch(model)
    handles = batch.join_many(PROMPTS, model.condition_states(identity), PARAMS, nll_from=starts)
    while len(batch):
        batch.step()
    for i, (p, s, q, start) in enumerate(zip(PROMPTS, identity, PARAMS, starts, strict=True)):
        got = batch.take(handles[i])
        (alone,) = generate(model, [p], model.condition_states([s]), q, nll_from=[start])
        assert got.tokens == alone.tokens == solo(model, p, s, q).tokens, i
        assert bool(got.prompt_nll[:start].isnan().all()) and not bool(got.prompt_nll[start:].isnan().any())
        torch.testing.assert_close(got.prompt_nll, alone.prompt_nll, atol=1e-5, rtol=0, equal_nan=True)
    with pytest.raises(ValueError, match="nll_from"):
        DecodeBatch(model).join(PROMPTS[2], model.condition_states(identity[:1]), PARAMS[0], nll_from=2)


def decode_joining(
    model: IdentityModel,
    identity: list[IdentityState],
    together: bool,
    logprobs: dict[int, list[float]] | None = None,
    params: list[SamplingParams] = PARAMS,
) -> tuple[DecodeBatch, dict[int, int], list[int], dict[int, str]]:
    """PROMPTS joining one batch at JOIN_AT (decoded with ``params``), stepped until every row stopped: the batch, each
    prompt's handle, the batch size at each step, each prompt's streamed text (and each handle's log-probabilities,
    if asked)."""
    batch = DecodeBatch(model)
    handles: dict[int, int] = {}
    sizes, texts = [], {i: "" for i in range(len(PROMPTS))}
    step = 0
    while len(handles) < len(PROMPTS) or len(batch):
        now = [i for i, at in enumerate(JOIN_AT) if at == step]
        if together and len(now) > 1:
            cond = model.condition_states([identity[i] for i in now])
            joined = batch.join_many([PROMPTS[i] for i in now], cond, [params[i] for i in now])
            handles.update(zip(now, joined, strict=True))
        else:
            for i in now:
                handles[i] = batch.join(PROMPTS[i], model.condition_states([identity[i]]), params[i])
        sizes.append(len(batch))
        for event in batch.step():
            texts[next(i for i, h in handles.items() if h == event.row)] += event.text
            if logprobs is not None:
                logprobs.setdefault(event.row, []).append(event.logprob)
        step += 1
    return batch, handles, sizes, texts


def decode_as_alone(
    model: IdentityModel, identity: list[IdentityState], together: bool, params: list[SamplingParams], sums: bool = False
) -> list[Generation]:
    """PROMPTS decoded alone with ``params``, and joining one batch (``decode_joining``): every row ends as it does
    alone (its summary sums too, with ``sums``), the rows having shared steps; the Generations alone."""
    expected = [solo(model, p, s, q) for p, s, q in zip(PROMPTS, identity, params, strict=True)]
    batch, handles, sizes, texts = decode_joining(model, identity, together, params=params)
    assert max(sizes) >= 3  # rows really shared steps
    for i, want in enumerate(expected):
        got = batch.take(handles[i])
        assert got.tokens == want.tokens, i
        assert got.text == want.text == texts[i]
        if sums:
            torch.testing.assert_close(got.stats.hidden, want.stats.hidden, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(got.stats.layer_inputs, want.stats.layer_inputs, atol=1e-4, rtol=1e-4)
            assert float(got.stats.count) == float(want.stats.count)
    return expected


@pytest.mark.parametrize("together", [False, True], ids=["prefilled-alone", "prefilled-together"])
@pytest.mark.parametrize("build", [lambda: llama(0, 1), native], ids=["llama", "native"])
def test_rows_with_repetition_controls_decode_in_a_batch_as_they_would_alone(build: object, together: bool) -> None:
    """Each row's repetition penalty and n-gram ban read its own reply only, whoever shares its steps; the controls
    really change what the rows decode."""
    model = build()  # type: ignore[operator]
    identity = states(model, len(PROMPTS))
    params = [replace(p, max_new_tokens=12, repetition_penalty=1.5, no_repeat_ngram=2) for p in PARAMS]
    params[2] = replace(params[2], repetition_penalty=1.0)  # rows with different controls share the batch
    params[3] = replace(params[3], no_repeat_ngram=0)
    expected = decode_as_alone(model, identity, together, params)
    plain = [
        solo(model, p, s, replace(q, repetition_penalty=1.0, no_repeat_ngram=0))
        for p, s, q in zip(PROMPTS, identity, params, strict=True)
    ]
    assert [g.tokens for g in plain] != [g.tokens for g in expected]


@pytest.mark.parametrize("build", [lambda: llama(0, 1), native], ids=["llama", "native"])
def test_rows_decoding_in_lowercase_to_a_sentence_limit_or_exclaiming_decode_in_a_batch_as_they_would_alone(
    build: object,
) -> None:
    """Rows in lowercase and ending soon after two words, rows cut after a sentence, an exclaiming row with an address
    and rows with none of these share steps: each decodes what it would alone."""
    model = build()  # type: ignore[operator]
    identity = states(model, len(PROMPTS))
    params = [replace(p, max_new_tokens=16) for p in PARAMS]
    params[0] = replace(params[0], lowercase=True, max_words=2)
    params[1] = replace(params[1], max_sentences=1)
    params[2] = replace(params[2], lowercase=True, max_sentences=1)
    params[3] = replace(params[3], exclaim=True, address=", sir")
    expected = [solo(model, p, s, q) for p, s, q in zip(PROMPTS, identity, params, strict=True)]
    batch, handles, sizes, texts = decode_joining(model, identity, True, params=params)
    assert max(sizes) >= 3  # the rows really shared steps
    for i, want in enumerate(expected):
        got = batch.take(handles[i])
        assert got.tokens == want.tokens, i
        assert got.text == want.text == texts[i]
        if params[i].lowercase:
            assert got.text == got.text.lower()


@pytest.mark.parametrize("together", [False, True], ids=["prefilled-alone", "prefilled-together"])
@pytest.mark.parametrize("build", [lambda: llama(2, 2), native], ids=["llama-memory-slots", "native"])
def test_rows_whose_replies_are_taken_back_decode_in_a_batch_as_they_would_alone(
    build: object, together: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every first word judged another language's: the guarded rows are taken back and begun again (their tokens read
    hidden in the batch's columns) while other rows step beside them; each ends as it does alone, sums included."""
    monkeypatch.setattr(generate_module, "foreign_opening", lambda opening, user, ended=False: True)
    model = build()  # type: ignore[operator]
    identity = states(model, len(PROMPTS))
    params = [replace(p, max_new_tokens=10) for p in PARAMS]
    for i in (0, 1):
        params[i] = replace(params[i], reply_to="Hi! I'm Ana Kowalski from Lisbon.")
    expected = decode_as_alone(model, identity, together, params, sums=True)
    unguarded = solo(model, PROMPTS[0], identity[0], replace(params[0], reply_to=""))
    assert unguarded.tokens != expected[0].tokens  # the guard really changed the reply


def test_a_cancelled_row_leaves_at_once_and_the_others_go_on_unchanged() -> None:
    model = llama(2, 1)
    identity = states(model, 3)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    expected = [solo(model, p, s, params) for p, s in zip(PROMPTS[:3], identity, strict=True)]
    batch = DecodeBatch(model)
    rows = [batch.join(p, model.condition_states([s]), params) for p, s in zip(PROMPTS[:3], identity, strict=True)]
    batch.step()
    batch.cancel(rows[1])
    assert len(batch) == 2 and rows[1] not in batch.rids
    while len(batch):
        batch.step()
    for i in (0, 2):
        assert batch.take(rows[i]).tokens == expected[i].tokens
    with pytest.raises(KeyError):
        batch.take(rows[1])  # a cancelled row has no result
    with pytest.raises(KeyError):
        batch.cancel(rows[0])  # it has left already
    assert batch.cache is None and batch.valid.shape[0] == 0  # an empty batch holds no memory


def test_a_rows_token_is_sampled_before_the_forward_that_feeds_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sample()`` gives each row's token from the logits already computed (the first one straight from the
    prefill, with no forward of its own); ``advance()`` runs the forward. step() is the two in turn; rows join and
    leave only between steps."""
    model = llama(2, 1)
    identity = states(model, 2)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    expected = [solo(model, p, s, params) for p, s in zip(PROMPTS[:2], identity, strict=True)]
    forwards = []
    original = type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda self, *a, **k: forwards.append(1) or original(self, *a, **k))
    batch = DecodeBatch(model)
    rows = [batch.join(p, model.condition_states([s]), params) for p, s in zip(PROMPTS[:2], identity, strict=True)]
    prefilled = len(forwards)
    first = batch.sample()
    assert len(forwards) == prefilled  # the first tokens came from the prefills
    assert [e.token for e in first] == [expected[0].tokens[0], expected[1].tokens[0]]
    with pytest.raises(RuntimeError, match="advance"):
        batch.sample()
    with pytest.raises(RuntimeError, match="half done"):
        batch.join(PROMPTS[2], model.condition_states(identity[:1]), params)
    with pytest.raises(RuntimeError, match="half done"):
        batch.cancel(rows[0])
    batch.advance()
    assert len(forwards) == prefilled + 1  # both rows' tokens in one forward
    with pytest.raises(RuntimeError, match="sample"):
        batch.advance()
    while len(batch):
        batch.step()
    assert [batch.take(r).tokens for r in rows] == [g.tokens for g in expected]


def test_bad_joins_are_refused() -> None:
    model = llama(0, 1)
    batch = DecodeBatch(model)
    fresh = IdentityState.fresh(model.config)
    with pytest.raises(ValueError, match="one-row"):
        batch.join([1, 2], model.condition_states([fresh, fresh]), SamplingParams())
    with pytest.raises(ValueError, match="at least one token"):
        batch.join([], model.condition_states([fresh]), SamplingParams())
    with pytest.raises(ValueError, match="context"):
        batch.join([1] * 200, model.condition_states([fresh]), SamplingParams(max_new_tokens=100))
    with pytest.raises(ValueError, match="as many"):
        batch.join_many([[1, 2], [3]], model.condition_states([fresh]), [SamplingParams()] * 2)
    with pytest.raises(ValueError, match="context"):  # one row too long refuses them all: none joins
        batch.join_many([[1, 2], [1] * 200], model.condition_states([fresh, fresh]), [SamplingParams(max_new_tokens=100)] * 2)
    assert len(batch) == 0


def test_a_turn_decoded_in_a_running_batch_ends_in_the_state_it_reaches_alone() -> None:
    """turn_prompt -> DecodeBatch -> conclude_turns is run_turn: same reply, shock and new state."""
    model = llama(2, 2)
    tok = model.tokenizer
    identity = states(model, 2)
    dynamics = Dynamics.from_config(model.config)
    requests = [
        TurnRequest(state=identity[0], message="hello there", dynamics=dynamics),
        TurnRequest(state=identity[1], message="a longer message, joining late", dynamics=dynamics, context=(1, 2, 3)),
    ]
    params = SamplingParams(max_new_tokens=6, temperature=0.7, seed=5)
    alone = [run_turn(model, r, params) for r in requests]
    batch = DecodeBatch(model)
    prompts = [turn_prompt(tok, r) for r in requests]
    first = batch.join(prompts[0].tokens, model.condition_states([identity[0]]), params, prompts[0].counted)
    batch.step()
    second = batch.join(prompts[1].tokens, model.condition_states([identity[1]]), params, prompts[1].counted)
    while len(batch):
        batch.step()
    together = conclude_turns(model, requests, prompts, [batch.take(first), batch.take(second)])
    for got, want in zip(together, alone, strict=True):
        assert got.reply == want.reply and got.finish_reason == want.finish_reason
        assert got.shock == pytest.approx(want.shock, abs=1e-5) and got.nll == pytest.approx(want.nll, abs=1e-5)
        torch.testing.assert_close(got.state.self_state, want.state.self_state, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.state.trace.float(), want.state.trace.float(), atol=1e-3, rtol=0)
