from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sia.checkpoint import save_checkpoint
from sia.identity.shock import standardised_shock
from sia.identity.state import Dynamics, IdentityState, advance
from sia.learn.native.attention_maps import attention_weights, capture_attention
from sia.learn.native.corpus import Episode, make_corpus
from sia.learn.native.evaluate import evaluate, run_eval
from sia.learn.native.metrics import history_dependence, perplexity
from sia.learn.native.plots import PLOT_FILES
from sia.learn.native.recall import MODES, recall
from sia.learn.native.train import encode_episode_turns
from sia.model.native import SIAModel, TraceAttention
from sia.model.tokenizer import ByteTokenizer
from sia.personas import persona_preamble
from tests.conftest import random_state, sharpen, tiny_config

BLOCK = 1024  # transcripts of whole episodes fit
Report = tuple[Path, dict[str, Any]]


def _model(seed: int = 0, **overrides: Any) -> SIAModel:
    torch.manual_seed(seed)
    return SIAModel(tiny_config(block_size=BLOCK, **overrides)).eval()


@pytest.fixture(scope="module")
def episodes() -> tuple[Episode, ...]:
    return make_corpus(0, n_train=1, n_heldout=6).heldout


@pytest.fixture(scope="module")
def sharp() -> SIAModel:
    """An untrained model whose state visibly matters: sharpened attention and a saturating self-state update."""
    model = sharpen(_model())
    with torch.no_grad():
        model.self_update.proj.weight.mul_(30)
    return model


@pytest.fixture(scope="module")
def report(
    tmp_path_factory: pytest.TempPathFactory, sharp: SIAModel, episodes: tuple[Episode, ...]
) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("eval")
    return out, evaluate(sharp, episodes, out, twin=_model(1, attention="dot"), seed=3)


# ---------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------


def test_evaluate_writes_the_report_the_json_and_every_plot(report: Report) -> None:
    out, figures = report
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(figures))
    for name in PLOT_FILES.values():
        assert (out / name).stat().st_size > 1000
        assert f"]({name})" in (out / "report.md").read_text()
    markdown = (out / "report.md").read_text()
    assert "| figure | value | target | result |" in markdown
    assert figures["model"]["config"]["attention"] == "trace" and figures["twin"]["config"]["attention"] == "dot"
    assert len(figures["targets"]) == 6 and all(t["pass"] in (True, False, None) for t in figures["targets"])


def test_recall_is_scored_for_every_probe_in_every_mode(report: Report, episodes: tuple[Episode, ...]) -> None:
    _, figures = report
    n_probes = sum(len(e.probes) for e in episodes)
    assert figures["n_probes"] == n_probes > 0
    rec = figures["recall"]
    assert set(rec["model"]) == set(MODES) and set(rec["twin"]) == {"stateless", "transcript"}
    for summaries in (rec["model"], rec["twin"]):
        for summary in summaries.values():
            assert summary["scored"] == n_probes
            assert 0.0 <= summary["accuracy"] <= 1.0
            assert sum(f["n"] for f in summary["by_fact"].values()) == n_probes
    expected = sum(1 / len(p.candidates) for e in episodes for p in e.probes) / n_probes
    assert rec["chance"] == pytest.approx(expected)


def test_determinism_control_reset_and_twin_perplexity(report: Report) -> None:
    _, figures = report
    hist = figures["history_dependence"]
    assert hist["pairs"] >= 1
    assert hist["control_kl"] == 0.0 and hist["logits_replay_identical"]
    assert hist["kl_mean"] > 1e-6  # this model's replies depend on the history
    reset = figures["reset_determinism"]
    assert reset["reply_equal"] and reset["state_equal"] and reset["shock_equal"]
    assert reset["history_changed_state"]  # the reset identity really had a different state before
    ppl = figures["perplexity"]
    assert math.isfinite(ppl["twin"]) and ppl["twin"] > 1
    assert ppl["ratio"] == pytest.approx(ppl["model"] / ppl["twin"])


# ---------------------------------------------------------------------------------------------------------
# Perplexity against an independent computation with the serving-side (unbatched) update rules
# ---------------------------------------------------------------------------------------------------------


def _reference_perplexity(model: SIAModel, episode: Episode) -> float:
    tok = ByteTokenizer()
    config = model.config
    state = IdentityState.fresh(config)
    preamble = tok.encode(persona_preamble(episode.persona))
    total, count = 0.0, 0
    for turn in episode.turns:
        prompt = tok.chat_prompt(turn.user, preamble)
        ids = torch.tensor([[*prompt, *tok.encode(turn.reply), tok.end_id]])
        counted = torch.zeros_like(ids, dtype=torch.bool)
        counted[0, len(preamble) : ids.shape[1] - 1] = True  # from <|user|> to the last reply byte
        with torch.no_grad():
            out = model(ids, model.condition_states([state]), summary_mask=counted)
            logp = F.log_softmax(out.logits[0, :-1].double(), dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            summary = model.summarize(out.stats).row(0)
        reply = logp[len(prompt) - 1 :]  # the reply bytes and its <|end|>
        total -= float(reply.sum())
        count += reply.numel()
        n_message = len(tok.encode(turn.user)) + 1  # its bytes and <|end|>, predicted from <|user|> on
        nll = -float(logp[len(preamble) : len(preamble) + n_message].mean())
        shock = standardised_shock(nll, state.shock, config)
        state = advance(state, summary, shock=shock, nll=nll, g=model.self_update, dynamics=Dynamics.from_config(config))
    return math.exp(total / count)


def test_perplexity_equals_exp_of_the_mean_reply_nll(sharp: SIAModel, episodes: tuple[Episode, ...]) -> None:
    episode = episodes[0]
    with torch.no_grad():
        carried = perplexity(sharp, [episode])
        stateless = perplexity(sharp, [episode], carry=False)
    assert carried == pytest.approx(_reference_perplexity(sharp, episode), rel=1e-4)
    assert abs(carried - stateless) > 1e-2 * carried  # the check above would notice a state that is not carried


# ---------------------------------------------------------------------------------------------------------
# Recall scoring
# ---------------------------------------------------------------------------------------------------------


def _tagged(episodes: tuple[Episode, ...]) -> list[Episode]:
    """Each probe turn's message made unique, so that a hook can tell from the tokens which probe it is."""
    out = []
    for e, episode in enumerate(episodes):
        turns = list(episode.turns)
        for p, probe in enumerate(episode.probes):
            turns[probe.turn] = replace(turns[probe.turn], user=f"{turns[probe.turn].user} (probe {e}.{p})")
        out.append(replace(episode, turns=tuple(turns)))
    return out


def _favour(model: SIAModel, episodes: list[Episode], pick: str) -> list[Any]:
    """Hook the lm_head so that, in a probe turn, it strongly predicts the reply with ``pick``'s value in the slot:
    the true answer ("answer") or the candidate after it ("wrong"). Only whole sequences can be recognised."""
    tok = ByteTokenizer()
    wanted: dict[tuple[int, ...], tuple[list[int], list[int]]] = {}
    for episode in episodes:
        for probe in episode.probes:
            turn = episode.turns[probe.turn]
            suffix = turn.reply[len(probe.prefix) + len(probe.answer) :]
            k = probe.candidates.index(probe.answer)
            value = probe.answer if pick == "answer" else probe.candidates[(k + 1) % len(probe.candidates)]
            wanted[tuple(tok.encode(turn.user))] = (tok.encode(probe.prefix), [*tok.encode(value + suffix), tok.end_id])
    seen: list[Tensor] = []

    def record(module: nn.Module, args: tuple[Tensor, ...]) -> None:
        seen.append(args[0])

    def boost(module: nn.Module, args: tuple[Tensor, ...], logits: Tensor) -> Tensor:
        idx = seen.pop()
        logits = logits.clone()
        for b, row in enumerate(idx.tolist()):
            if tok.assistant_id not in row:
                continue
            a = len(row) - 1 - row[::-1].index(tok.assistant_id)
            u = len(row[:a]) - 1 - row[:a][::-1].index(tok.user_id)
            target = wanted.get(tuple(row[u + 1 : a - 1]))
            if target is None:
                continue
            prefix, rest = target
            slot = a + 1 + len(prefix)  # position of the value's first token
            for i, token in enumerate(rest):
                if slot + i - 1 < logits.shape[1]:
                    logits[b, slot + i - 1, token] += 200.0
        return logits

    return [model.wte.register_forward_pre_hook(record), model.lm_head.register_forward_hook(boost)]


@pytest.mark.parametrize("mode", MODES)
def test_recall_picks_the_candidate_the_model_favours(episodes: tuple[Episode, ...], mode: str) -> None:
    tagged = _tagged(episodes)
    model = _model()
    n_probes = sum(len(e.probes) for e in tagged)
    for pick in ("answer", "wrong"):
        handles = _favour(model, tagged, pick)
        try:
            with torch.no_grad():
                scored = recall(model, tagged, mode, batch_size=4, cached=False)
        finally:
            for handle in handles:
                handle.remove()
        assert len(scored) == n_probes
        accuracy = sum(s.correct for s in scored) / n_probes
        assert accuracy == (1.0 if pick == "answer" else 0.0)
        for s in scored:
            k = s.probe.candidates.index(s.probe.answer)
            assert s.predicted == (s.probe.answer if pick == "answer" else s.probe.candidates[(k + 1) % len(s.probe.candidates)])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attention", ["trace", "dot"])
def test_cached_scoring_equals_whole_sequence_scoring(episodes: tuple[Episode, ...], mode: str, attention: str) -> None:
    model = _model(2, attention=attention)
    if attention == "trace":
        sharpen(model)
    with torch.no_grad():
        cached = recall(model, episodes, mode, batch_size=3)
        whole = recall(model, episodes, mode, batch_size=3, cached=False)
    for a, b in zip(cached, whole, strict=True):
        assert a.probe == b.probe and len(a.scores) == len(a.probe.candidates)
        assert a.scores == pytest.approx(b.scores, abs=1e-3)


def test_state_mode_differs_from_stateless_mode(sharp: SIAModel, episodes: tuple[Episode, ...]) -> None:
    with torch.no_grad():
        state = recall(sharp, episodes, "state")
        stateless = recall(sharp, episodes, "stateless")
    assert any(abs(x - y) > 1e-3 for a, b in zip(state, stateless, strict=True) for x, y in zip(a.scores, b.scores, strict=True))


# ---------------------------------------------------------------------------------------------------------
# Attention maps and history dependence
# ---------------------------------------------------------------------------------------------------------


def test_attention_weights_reproduce_the_model_attention(sharp: SIAModel, episodes: tuple[Episode, ...]) -> None:
    tok = ByteTokenizer()
    config = sharp.config
    turn = encode_episode_turns(tok, episodes[0], transcript=False, block_size=BLOCK)[2]
    state = random_state(config, seed=5, scale=3.0)
    ids = torch.tensor([turn.ids])
    with torch.no_grad(), capture_attention(sharp) as captures:
        sharp(ids, sharp.condition_states([state]))
    assert len(captures) == config.n_layer
    for attn, cap in zip(sharp.attentions, captures, strict=True):
        assert isinstance(attn, TraceAttention)
        with torch.no_grad():
            weights = attention_weights(attn, cap)  # (1, H, L, 1+L)
            L = ids.shape[1]
            assert weights.shape == (1, config.n_head, L, L + 1)
            assert torch.allclose(weights.sum(-1), torch.ones(1, config.n_head, L))
            assert torch.all(weights[..., 0] > 0)  # the self slot is visible to every query
            assert torch.all(weights[0, :, 0, 2:] == 0)  # the first token sees only the slot and itself
            values = torch.cat([cap.lc.slot_value, attn.v_proj(cap.x).view(1, L, config.n_head, -1).transpose(1, 2)], dim=2)
            y = (weights @ values).transpose(1, 2).reshape(1, L, -1)
            assert torch.allclose(attn.o_proj(y), cap.output, atol=1e-5)


def test_history_dependence_control_is_exactly_zero(sharp: SIAModel) -> None:
    episodes = make_corpus(1, n_train=1, n_heldout=9).heldout
    with torch.no_grad():
        result = history_dependence(sharp, episodes, n_pairs=3, seed=0, batch_size=2)
    assert 1 <= result["pairs"] <= 3 and len(result["per_pair_kl"]) == result["pairs"]
    assert result["control_kl"] == 0.0 and result["logits_replay_identical"]
    assert result["kl_mean"] > 1e-6


# ---------------------------------------------------------------------------------------------------------
# The command-line entry point
# ---------------------------------------------------------------------------------------------------------


def test_run_eval_loads_checkpoints_and_builds_the_heldout_split(tmp_path: Path) -> None:
    save_checkpoint(_model(), tmp_path / "model")
    save_checkpoint(_model(1, attention="dot"), tmp_path / "twin")
    out = tmp_path / "out"
    figures = run_eval(tmp_path / "model", out, twin_checkpoint=tmp_path / "twin", seed=4, n_heldout=5, max_episodes=3)
    assert figures["n_episodes"] == 3
    assert figures["n_probes"] == sum(len(e.probes) for e in make_corpus(4, 1, 5).heldout[:3])
    assert figures["twin"]["config"]["attention"] == "dot"
    assert (out / "report.md").is_file() and (out / "report.json").is_file()


def test_evaluate_refuses_a_stateless_model(tmp_path: Path, episodes: tuple[Episode, ...]) -> None:
    with pytest.raises(ValueError, match="stateful"):
        evaluate(_model(attention="dot"), episodes, tmp_path)
