from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sia.identity.shock import standardised_shock
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, TurnResult, run_turn, stream_turns
from sia.model.config import ModelConfig
from sia.model.generate import SamplingParams
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer
from tests.conftest import sharpen

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def _request(state: IdentityState, message: str, config: ModelConfig) -> TurnRequest:
    return TurnRequest(state=state, message=message, dynamics=Dynamics.from_config(config))


def test_a_turn_advances_a_new_state_and_leaves_the_old_one(model: SIAModel, config: ModelConfig) -> None:
    state = IdentityState.fresh(config)
    result = run_turn(model, _request(state, "I love the colour green.", config), GREEDY)
    assert result.state.turns == 1 and state.turns == 0
    assert state.trace.abs().max() == 0 and state.self_state.abs().max() == 0
    assert result.state.trace.abs().max() > 0 and result.state.self_state.abs().max() > 0
    assert result.state.shock.count == 1 and result.state.shock.mean == pytest.approx(result.nll)
    assert result.prompt_tokens == len("I love the colour green.") + 3
    assert 1 <= result.completion_tokens <= 12
    # first turn: shock against the prior
    assert result.shock == pytest.approx(standardised_shock(result.nll, state.shock, config))
    result.state.validate(config)


def test_the_nll_is_that_of_the_message_and_its_end(model: SIAModel, config: ModelConfig) -> None:
    tok = ByteTokenizer()
    message = "hello"
    state = IdentityState.fresh(config)
    result = run_turn(model, _request(state, message, config), GREEDY)
    ids = torch.tensor([tok.chat_prompt(message)])
    with torch.no_grad():
        logits = model(ids, model.condition_states([state])).logits
    targets = ids[0, 1 : len(message) + 2]  # message bytes and <|end|>, each predicted from what precedes
    expected = F.cross_entropy(logits[0, : len(message) + 1], targets).item()
    assert result.nll == pytest.approx(expected, rel=1e-5)


def test_history_changes_the_reply_distribution(model: SIAModel, config: ModelConfig) -> None:
    sharpen(model)
    alice = bob = IdentityState.fresh(config)
    for text in ("My name is Alice and I adore cats!", "Cats are the best."):
        alice = run_turn(model, _request(alice, text, config), GREEDY).state
    for text in ("I am Bob. I HATE everything!!!", "Nothing works, ever."):
        bob = run_turn(model, _request(bob, text, config), GREEDY).state
    ids = torch.tensor([ByteTokenizer().chat_prompt("What do you remember?")])
    with torch.no_grad():
        la = F.log_softmax(model(ids, model.condition_states([alice])).logits[0, -1], -1)
        lb = F.log_softmax(model(ids, model.condition_states([bob])).logits[0, -1], -1)
    # an untrained model moves little (issue-level figures come from `sia eval` on the trained model), but
    # the distributions differ measurably, while replaying Alice's history reproduces hers exactly
    assert float((la.exp() * (la - lb)).sum()) > 1e-6
    replay = IdentityState.fresh(config)
    for text in ("My name is Alice and I adore cats!", "Cats are the best."):
        replay = run_turn(model, _request(replay, text, config), GREEDY).state
    assert torch.equal(replay.trace, alice.trace) and torch.equal(replay.self_state, alice.self_state)


def test_reset_identity_reproduces_a_fresh_one(model: SIAModel, config: ModelConfig) -> None:
    params = SamplingParams(max_new_tokens=16, temperature=0.9, seed=4)
    first = run_turn(model, _request(IdentityState.fresh(config), "Hi there", config), params)
    # an identity with history, then reset (a fresh state), replays the fresh identity exactly
    used = run_turn(model, _request(first.state, "Something else", config), params).state
    assert used.turns == 2
    replay = run_turn(model, _request(IdentityState.fresh(config), "Hi there", config), params)
    assert replay.reply == first.reply and replay.shock == first.shock
    assert torch.equal(replay.state.trace, first.state.trace) and torch.equal(replay.state.self_state, first.state.self_state)


def test_batched_turns_match_single_turns(model: SIAModel, config: ModelConfig) -> None:
    states = [
        IdentityState.fresh(config),
        run_turn(model, _request(IdentityState.fresh(config), "earlier", config), GREEDY).state,
    ]
    messages = ["short", "a somewhat longer message"]
    requests = [_request(s, m, config) for s, m in zip(states, messages, strict=True)]
    turn = stream_turns(model, requests, GREEDY)
    events = list(turn)
    batched = turn.result
    assert {e.row for e in events} == {0, 1}
    for req, got in zip(requests, batched, strict=True):
        solo: TurnResult = run_turn(model, req, GREEDY)
        assert solo.reply == got.reply
        assert math.isclose(solo.nll, got.nll, rel_tol=1e-5)
        torch.testing.assert_close(solo.state.trace, got.state.trace, atol=1e-5, rtol=1e-5)


def test_recent_context_is_read_but_not_summarised(model: SIAModel, config: ModelConfig) -> None:
    tok = ByteTokenizer()
    state = IdentityState.fresh(config)
    plain = run_turn(model, _request(state, "and then?", config), GREEDY)
    context = (*tuple(tok.chat_prompt("earlier words")[:-1]), tok.end_id)
    with_context = run_turn(model, TurnRequest(state, "and then?", Dynamics.from_config(config), context=context), GREEDY)
    assert with_context.prompt_tokens == plain.prompt_tokens + len(context)
    assert with_context.nll != plain.nll  # the context conditions the message's likelihood


def test_bad_requests(model: SIAModel, config: ModelConfig) -> None:
    with pytest.raises(ValueError, match="at least one"):
        next(iter(stream_turns(model, [], GREEDY)))
    with pytest.raises(TypeError, match="message must be str"):
        run_turn(model, _request(IdentityState.fresh(config), b"bytes", config), GREEDY)  # type: ignore[arg-type]


def test_a_stateless_twin_is_refused_before_any_work() -> None:
    from tests.conftest import tiny_config

    twin = SIAModel(tiny_config(attention="dot")).eval()
    with pytest.raises(ValueError, match="stateful model"):
        run_turn(twin, _request(IdentityState.fresh(twin.config), "hi", twin.config), GREEDY)
