"""The imprint's read adapter: absent from rows with an empty imprint (the base model exactly), trained by
sia.learn.imprint_read to answer from the imprinted words (its loss falls), kept with the identity parameters."""

from __future__ import annotations

import collections
import json
import math
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from sia.backbones.llama import LlamaModel
from sia.checkpoint import DEFAULT_CHECKPOINT, load_model
from sia.identity.imprint import KINDS, UNTOLD_SURE, Imprint, ImprintEntries
from sia.identity.state import IdentityState
from sia.learn.imprint_read import (
    DATA,
    EXTRA,
    MAIN,
    ReadConfig,
    ReadPhrases,
    _rival_choices,
    ask_messages,
    imprint_of,
    imprint_turns,
    imprints_of,
    lowered,
    make_example,
    message_inputs,
    message_reads,
    message_tokens,
    natural_asks,
    natural_example,
    natural_statements,
    parse_args,
    token_kinds,
    train_asks,
    train_kinds,
    train_read,
)
from sia.model.batching import DecodeBatch
from sia.model.conditioning import Conditioning
from sia.model.config import LlamaConfig
from sia.model.generate import ECHO_LEAN, ReplyDecoder, Sampling, SamplingParams, generate, row_params
from sia.model.language import (
    ECHO_OPENING,
    about_the_user,
    asked_parts,
    names_kind,
    recollection_reply,
    spoken_clause,
    untold_reply,
)
from sia.model.tokenizer import ByteTokenizer

from .conftest import hf_tiny

HF_TINY = hf_tiny(num_hidden_layers=2)


def tiny() -> LlamaModel:
    torch.manual_seed(0)
    hf = LlamaForCausalLM(HFLlamaConfig(**HF_TINY)).eval()
    config = LlamaConfig.from_hf(HF_TINY, d_self=8, trace_layers=[0], imprint_span=16, imprint_min_shock=0.0)
    model = LlamaModel(config, ByteTokenizer()).eval()
    model.load_base(hf.state_dict())
    return model


def phrases() -> ReadPhrases:
    kinds = (*MAIN, *EXTRA)
    return ReadPhrases(
        values={k: ("Ox", "Yak", "Emu") for k in kinds},
        clauses={k: (f"my {k} is {{v}}", f"{k}: {{av}}") for k in kinds},
        questions={k: (f"{k}?",) for k in kinds},
        answers={k: ("{v}.",) for k in kinds},
        openers=("hi",),
        closers=("bye",),
        connectors=(", ",),
        chitchat=("sky?", "rain."),
        others={"name": ("my sister {v} waves",)},
        asides=("the hall is beige", "Zed from upstairs drills"),
    )


def with_trained_like_read() -> LlamaModel:
    """The tiny model with an imprint of 24 entries and a rank-4 read adapter whose up maps are no longer zero."""
    model = tiny()
    model.add_imprint(24, 4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "imprint_read" in name and name.endswith("up.weight"):
                p.normal_(0, 0.5)
    return model


def test_the_read_adapter_acts_only_where_an_imprint_is() -> None:
    model, plain = with_trained_like_read(), tiny()
    assert any("imprint_read" in k for k in model.identity_state_dict())
    idx = torch.tensor([list(b"hello there")])
    fresh = IdentityState.fresh(model.config)
    with torch.no_grad():
        base = plain(idx, plain.condition_states([IdentityState.fresh(plain.config)])).logits
        empty = model(idx, model.condition_states([fresh], [3])).logits
        imprint = imprint_of(model, list(b"sys"), ("I am Ox",))
        read = model(idx, model.condition_states([replace(fresh, imprint=imprint)], [3])).logits
        no_adapter = replace(model.config, imprint_read_rank=0)
        model.config, kept = no_adapter, model.config
        for attn in model.attentions:
            attn.read_rank = 0
        unread = model(idx, model.condition_states([replace(fresh, imprint=imprint)], [3])).logits
    torch.testing.assert_close(empty, base, atol=1e-5, rtol=0)  # an empty imprint: no adapter, the base model
    assert imprint.used > 0
    assert (read - unread).abs().max() > 1e-2  # with an imprint the adapter changes the reading
    model.config = kept


def test_inference_reads_through_the_fused_maps_as_training_does_and_follows_changed_weights() -> None:
    model = with_trained_like_read()
    model.add_imprint_gate()
    with torch.no_grad():
        for attn in model.attentions:
            attn.imprint_gate.weight.normal_(0, 0.3)
            attn.imprint_gate.bias.normal_(0, 0.3)
    imprint = imprint_of(model, list(b"sys"), ("I am Ox",))
    held = replace(IdentityState.fresh(model.config), imprint=imprint)
    idx = torch.tensor([list(b"hello there"), list(b"who am I?? ")])

    def logits(grad: bool) -> Tensor:
        with torch.set_grad_enabled(grad):
            return model(idx, model.condition_states([held, held], [3, 3])).logits.detach()

    fused = logits(False)
    assert all(a._fused is not None for a in model.attentions if a.read_rank)  # inference used the fused maps
    torch.testing.assert_close(fused, logits(True), atol=1e-5, rtol=1e-5)  # the maps one by one, as training reads
    with torch.no_grad():
        model.attentions[0].imprint_read_q.up.weight.mul_(3.0)  # an in-place change: the fused copy is made again
        model.attentions[0].imprint_gate.bias.add_(1.0)
    changed = logits(False)
    assert (changed - fused).abs().max() > 1e-3
    torch.testing.assert_close(changed, logits(True), atol=1e-5, rtol=1e-5)


def _whole_state_model(metric_rank: int | None = None) -> tuple[LlamaModel, IdentityState]:
    """A tiny model with every part of the state at work: a trace (layer 0; its metric's ``metric_rank`` largest
    eigenpairs carried), a self state read through the slots' per-token gate, an imprint with its gate and adapter."""
    torch.manual_seed(0)
    hf = LlamaForCausalLM(HFLlamaConfig(**HF_TINY)).eval()
    config = LlamaConfig.from_hf(
        HF_TINY, d_self=8, trace_layers=[0], slot_gate=True, imprint_span=16, imprint_min_shock=0.0, metric_rank=metric_rank
    )
    model = LlamaModel(config, ByteTokenizer()).eval()
    model.load_base(hf.state_dict())
    model.init_identity(seed=1, slot_bias=0.0)
    model.add_imprint(24, 4)
    model.add_imprint_gate()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("imprint_read" in name and name.endswith("up.weight")) or "gate" in name:
                p.normal_(0, 0.3)
    state = replace(
        IdentityState.fresh(config),
        trace=torch.randn(config.trace_shape).to(IdentityState.fresh(config).trace.dtype) * 0.3,
        self_state=torch.rand(config.d_self) * 2 - 1,
        imprint=imprint_of(model, list(b"sys"), ("I am Ox",)),
    )
    return model, state


def _decoded(model: LlamaModel, state: IdentityState, idx: Tensor, prompt: int) -> tuple[Tensor, Any]:
    """The logits of a prompt, then one token a step through a cache, as decoding goes (the persona's prompt 3
    tokens, unread); and the turn's conditioning."""
    with torch.no_grad():
        c = model.condition_states([state], [3])
        cache = model.new_cache(c, idx.shape[1])
        steps = [model(idx[:, :prompt], c, cache=cache).logits]
        steps += [model(idx[:, i : i + 1], c, cache=cache).logits for i in range(prompt, idx.shape[1])]
    return torch.cat(steps, dim=1), c


@pytest.mark.parametrize("metric_rank", [None, 3])
def test_cached_decoding_reads_the_whole_state_as_the_training_form_does(metric_rank: int | None) -> None:
    """Inference's form of the stateful attention (one product for the query's gate columns and the adapter's down
    maps) against training's, with every part of the state at work, the imprint behind the persona's prompt; with the
    whole metric and with 3 of its 16 eigenpairs (the imprint's keys then carry 3 metric columns too)."""
    model, state = _whole_state_model(metric_rank)
    idx = torch.tensor([list(b"hello there, Ox")])
    with torch.enable_grad():
        whole = model(idx, model.condition_states([state], [3])).logits.detach()  # the training form, all at once
    steps, c = _decoded(model, state, idx, 11)
    assert all(layer.maps for layer in c.layers)  # decoding took inference's form
    assert c.layers[0].metric is not None and c.layers[0].metric.abs().max() > 0
    torch.testing.assert_close(steps, whole, atol=1e-4, rtol=1e-4)


def test_a_word_goes_on_through_every_byte_beyond_ascii() -> None:
    """word_starts (the copy read's test of whether a token begins a word): a space or a mark begins one, a letter or a
    digit goes on it, and so does every byte >= 0x80, whatever character Latin-1 would make of it (0xBA, the second
    byte of "ź", is "º", a letter; 0xAC, of "Ŭ", is "¬", a mark; 0x80-0x9F are control characters)."""
    model, _ = _whole_state_model()
    starts = model.word_starts()
    assert all(bool(starts[b]) for b in b" .,!?-'\n")
    assert not any(bool(starts[b]) for b in b"aZ09")
    assert not any(bool(starts[b]) for b in range(0x80, 0x100))
    assert not bool(starts["ź".encode()[1]]) and not bool(starts["Ŭ".encode()[1]])


def test_a_bfloat16_step_on_the_cpu_runs_the_states_small_products_in_float32() -> None:
    """A bfloat16 model decoding on a CPU: the state's maps for the turn are kept in float32 (there a bfloat16
    product of a few rows costs several times a float32 one and its casts), the logits are bfloat16, and they are
    the float32 model's to bfloat16's rounding."""
    model, state = _whole_state_model()
    idx = torch.tensor([list(b"hello there, Ox")])
    reference, _ = _decoded(model, state, idx, 11)
    steps, c = _decoded(model.to(torch.bfloat16), state, idx, 11)
    maps = [m for layer in c.layers for m in layer.maps]
    assert maps and all(m.weight.dtype == torch.float32 for m in maps)
    assert maps[0].metric_q is not None and maps[0].metric_q.dtype == torch.float32
    assert maps[0].up is not None and maps[0].out_up is not None and maps[0].out_up.dtype == torch.float32
    assert steps.dtype == torch.bfloat16
    scale = reference.abs().max()
    assert (steps.float() - reference).abs().max() < 0.05 * scale
    assert (steps.float().argmax(-1) == reference.argmax(-1)).float().mean() > 0.9


def test_examples_state_the_asked_fact_among_distractors() -> None:
    rng = random.Random(0)
    p = phrases()
    for _ in range(20):
        ex = make_example(rng, p, distractors=2, extra_rate=0.5)
        stated = [m for m in ex.messages if m not in p.chitchat]
        assert len(stated) == 1 and 1 <= len(ex.messages) <= 3
        asked = next(k for k in ex.facts if ex.question == f"{k}?")
        assert ex.answer == f"{ex.facts[asked]}." and ex.facts[asked] in stated[0]


def test_rivals_tell_the_answer_with_each_of_the_users_other_values_and_its_article() -> None:
    rng = random.Random(3)
    values = ("Ox", "Yak", "Emu", "Gnu", "Asp")
    p = replace(
        phrases(), values=dict.fromkeys(phrases().values, values), answers=dict.fromkeys(phrases().answers, ("you: {av}.",))
    )
    seen = 0
    for _ in range(40):
        ex = make_example(rng, p, distractors=0, extra_rate=0.0)
        value = ex.answer.removesuffix(".").split()[-1]
        article = "an" if value[0] in "AEIOU" else "a"
        assert ex.answer == f"you: {article} {value}." and value in ex.facts.values()
        others = [v for v in dict.fromkeys(ex.facts.values()) if v != value]
        assert ex.rivals == tuple(f"you: {article} {v}." for v in others)  # the answer's own article, then the rival
        seen += len(others)
    assert seen > 20


def test_rival_choices_are_where_answer_and_rivals_first_part() -> None:
    tok = ByteTokenizer()
    prompt, _ = tok.turn_prompt("pet?", list(b"sys "))
    rows = [(prompt + tok.reply_tokens("an Ox."), len(prompt)), (prompt + tok.reply_tokens("Emu."), len(prompt))]
    choices = _rival_choices(tok, rows, [("an Asp.", "an Owl.", "an Ox.", "an Ant."), ()])
    start = len(prompt)  # the reply's first token: "a"; the value begins at start + 3
    # the logits before the first token each rival parts at, the answer's own token there first, then each distinct
    # rival's; a rival equal to the answer parts nowhere, and the second answer has no rival
    assert [(b, at, ids.tolist()) for b, at, ids in choices] == [
        (0, start + 2, [ord("O"), ord("A")]),
        (0, start + 3, [ord("x"), ord("w")]),
    ]


def test_training_with_rivals_adds_the_rival_term() -> None:
    # (a frozen random tiny backbone cannot learn to rank its values: the term's fall is measured on SmolLM2, in the
    # lab log; here, that it is counted where an example has rivals and only with a weight)
    losses = {}
    for weight in (0.0, 1.0):
        model = tiny()
        model.add_imprint(32, 4)
        config = ReadConfig(steps=6, batch=4, lr=0.0, rank=4, tokens=32, distractors=1, rival_weight=weight, log_every=100)
        losses[weight] = [h["rival"] for h in train_read(model, [list(b"Hi. ")], config, phrases())]
    assert losses[0.0] == [0.0] * 6
    # four examples a batch, each stating one to four facts: most batches hold rivals; among two to five first tokens
    # a random model's cross-entropy is near their log
    assert sum(r > 0 for r in losses[1.0]) >= 4 and all(0 <= r < 3 for r in losses[1.0])


def test_someone_elses_fact_is_stated_but_never_labelled() -> None:
    rng = random.Random(1)
    p = phrases()
    for _ in range(30):
        ex = make_example(rng, p, distractors=0, extra_rate=0.0, others_rate=1.0)
        (message,) = ex.messages
        at = message.index("my sister ")
        end = message.index(" waves", at) + len(" waves")
        assert all(b <= at or a >= end for a, b, _ in ex.clauses[0])  # outside every clause of the user's
        assert set(token_kinds(ByteTokenizer(), message, ex.clauses[0])[at:end]) == {0}
    assert not any("my sister" in make_example(rng, p, distractors=0, extra_rate=0.0).messages[0] for _ in range(10))


def test_asides_are_said_beside_the_facts_and_as_unrelated_messages_but_never_labelled() -> None:
    rng, p = random.Random(3), phrases()
    beside = unrelated = 0
    for _ in range(40):
        ex = make_example(rng, p, distractors=2, extra_rate=0.0, aside_rate=1.0)
        ((at, clauses),) = ex.clauses.items()
        message = ex.messages[at]
        said = [a for a in p.asides if a in message]
        assert said  # one or two, beside the facts, outside every clause of the user's
        for aside in said:
            start = message.index(aside)
            assert all(b <= start or a >= start + len(aside) for a, b, _ in clauses)
        assert sorted(k for _, _, k in clauses) == sorted(ex.facts)
        beside += len(said)
        unrelated += sum(m in p.asides for i, m in enumerate(ex.messages) if i != at)
        assert all(m in p.asides for i, m in enumerate(ex.messages) if i != at)  # rate 1: no question among them
    assert beside > 40 and unrelated > 20
    rng = random.Random(4)
    plain = [make_example(rng, p, distractors=2, extra_rate=0.2) for _ in range(20)]
    assert not any(a in m for ex in plain for m in ex.messages for a in p.asides)


def test_a_job_or_hobby_told_by_what_the_user_does_is_answered_in_their_own_verb() -> None:
    p = replace(
        phrases(),
        doings={"job": ("mend nets",), "hobby": ("fly kites",)},
        doing_clauses={"job": ("I {v} for a living",), "hobby": ("on weekends I {v}",)},
        doing_answers={"job": ("You {v}.",), "hobby": ("You love to {v}.",)},
    )
    rng, told = random.Random(5), collections.Counter[str]()
    for _ in range(60):
        ex = make_example(rng, p, distractors=1, extra_rate=0.0, doing_rate=1.0)
        ((at, clauses),) = ex.clauses.items()
        for a, b, kind in clauses:  # every job and hobby told by its doing, labelled with its kind like any fact
            said = ex.messages[at][a:b]
            if kind in ("job", "hobby"):
                assert said == ("I mend nets for a living" if kind == "job" else "on weekends I fly kites")
                told[kind] += 1
        asked = next(k for k in ex.facts if ex.question == f"{k}?")
        expected = {"job": "You mend nets.", "hobby": "You love to fly kites."}.get(asked, f"{ex.facts[asked]}.")
        assert ex.answer == expected
    assert told["job"] > 10 and told["hobby"] > 10
    # at rate 0 the doings draw nothing: the same seed gives the examples it gave before they existed
    before = [make_example(random.Random(9), phrases(), distractors=2, extra_rate=0.3) for _ in range(3)]
    after = [make_example(random.Random(9), p, distractors=2, extra_rate=0.3) for _ in range(3)]
    assert before == after


def test_the_shipped_doings_are_read_with_the_phrase_tables_and_bad_ones_refused(tmp_path: Path) -> None:
    p = ReadPhrases.load()
    assert set(p.doings) == {"job", "hobby"} and all(len(v) >= 50 for v in p.doings.values())
    assert all("{v}" in t for part in (p.doing_clauses, p.doing_answers) for ts in part.values() for t in ts)
    for name in ("read_values.json", "read_templates.json"):
        (tmp_path / name).write_text((DATA / name).read_text())
    doings = json.loads((DATA / "read_doings.json").read_text())
    doings["answers"]["job"] = ["You work as {av}."]
    (tmp_path / "read_doings.json").write_text(json.dumps(doings))
    with pytest.raises(ValueError, match="doing template"):
        ReadPhrases.load(tmp_path)


def test_facts_told_over_two_messages_keep_their_order_and_labels() -> None:
    rng = random.Random(2)
    p = phrases()
    split = 0
    for _ in range(40):
        ex = make_example(rng, p, distractors=2, extra_rate=0.0, split_rate=1.0)
        stated = sorted(ex.clauses)
        assert len(stated) == (2 if len(ex.facts) > 1 else 1)
        split += len(stated) == 2
        told = [ex.messages[i][a:b] for i in stated for a, b, _ in ex.clauses[i]]
        kinds = [k for i in stated for _, _, k in ex.clauses[i]]
        assert sorted(kinds) == sorted(ex.facts) and all(ex.facts[k] in t for k, t in zip(kinds, told, strict=True))
        assert all(m in p.chitchat for i, m in enumerate(ex.messages) if i not in ex.clauses)
    assert split >= 20


@pytest.mark.parametrize("distill", [0.0, 1.0])
def test_training_the_read_lowers_the_answer_loss(distill: float) -> None:
    model = tiny()
    model.add_imprint(32, 4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = ReadConfig(steps=40, batch=4, lr=3e-2, rank=4, tokens=32, distractors=1, distill_weight=distill, log_every=100)
    history = train_read(model, [list(b"You are kind. "), list(b"Hi. ")], config, phrases())
    last = sum(h["answer"] for h in history[-5:]) / 5
    assert last < history[0]["answer"] - 0.4  # nats per reply token: a random tiny backbone answers near ln(300) = 5.7
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("imprint_read" in n for n in changed)  # only the read adapter learns
    assert all(h["kl"] >= 0 for h in history)
    assert not any(p.requires_grad for p in model.parameters())


def test_the_read_trains_through_the_copy_read_where_asked() -> None:
    """through_copy: the imprints keep their token ids, so the answer's loss is the copy read's mixture's (the answer's
    value is among the imprinted tokens: a lower loss than the model's alone on the same examples), and the read adapter
    learns through it (one batch, trained on: its loss falls, every step finite); a model without the copy read
    refuses it."""
    from sia.learn.imprint_read import _batch, _conditioned

    config = ReadConfig(steps=1, batch=4, lr=3e-2, rank=4, tokens=32, distractors=1, distill_weight=0.0, log_every=100)
    systems = [list(b"You are kind. "), list(b"Hi. ")]

    def copying() -> LlamaModel:
        model = tiny()
        model.add_imprint(32, 4)
        model.config = replace(model.config, imprint_copy=2.0)
        return model

    first = {
        through: train_read(copying(), systems, replace(config, through_copy=through), phrases())[0]["answer"]
        for through in (False, True)
    }
    assert first[True] < first[False] - 1.0
    with pytest.raises(ValueError, match="copy read"):
        train_read(tiny_with_read(), systems, replace(config, through_copy=True), phrases())

    model, tok = copying(), ByteTokenizer()
    rng = random.Random(0)
    examples = [make_example(rng, phrases(), distractors=1, extra_rate=0.0) for _ in range(4)]
    imprints: list[Imprint | None] = list(imprints_of(model, [systems[1]] * 4, [ex.messages for ex in examples], keep_text=True))
    prompts = [tok.turn_prompt(ex.question, systems[1])[0] for ex in examples]
    idx, counted = _batch(
        [(p + tok.reply_tokens(ex.answer), len(p)) for p, ex in zip(prompts, examples, strict=True)], tok.pad_id, model.device
    )
    trainable = [p for n, p in model.named_parameters() if "imprint_read" in n]
    for p in trainable:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(trainable, lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(20):
        logits = model(idx, _conditioned(model, imprints, [len(systems[1])] * 4)).logits[:, :-1]
        loss = F.cross_entropy(logits[counted], idx[:, 1:][counted])
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.3


def test_the_imprint_gate_starts_at_the_model_as_it_was_and_shut_is_the_base_model() -> None:
    model, plain = with_trained_like_read(), tiny()
    fresh = IdentityState.fresh(model.config)
    idx = torch.tensor([list(b"hello there")])
    imprint = imprint_of(model, list(b"sys"), ("I am Ox",))
    assert imprint.used > 0
    held, empty = replace(fresh, imprint=imprint), fresh
    with torch.no_grad():
        base = plain(idx, plain.condition_states([IdentityState.fresh(plain.config)])).logits
        before = [model(idx, model.condition_states([s], [3])).logits for s in (held, empty)]
        model.add_imprint_gate()
        assert model.config.imprint_gate and any("imprint_gate" in k for k in model.identity_state_dict())
        at_zero = [model(idx, model.condition_states([s], [3])).logits for s in (held, empty)]
        # a zero gate: the model as it was, to float32 rounding (at inference the gate's map is stacked with the read
        # adapter's down maps in one product, whose summation order can differ from the down maps' alone)
        torch.testing.assert_close(at_zero, before, atol=1e-5, rtol=0)
        for attn in model.attentions:
            attn.imprint_gate.bias.fill_(-1e3)  # every token shuts the entries and its read adapter
        shut = [model(idx, model.condition_states([s], [3])).logits for s in (held, empty)]
        for attn in model.attentions:
            attn.imprint_gate.bias.fill_(3.0)  # every token leans on the imprint
        opened = model(idx, model.condition_states([held], [3])).logits
    assert (before[0] - base).abs().max() > 1e-2  # the imprint and its adapter change the reading ...
    torch.testing.assert_close(shut[0], base, atol=1e-5, rtol=0)  # ... shut, the row reads as the base model
    torch.testing.assert_close(shut[1], before[1], atol=0, rtol=0)  # a state with no entries never changes
    assert (opened - before[0]).abs().max() > 1e-3


def _distillation(model: LlamaModel, examples: list[Any]) -> float:
    """KL from the base model (no imprint) to the model (the example's imprint) over the examples' ordinary replies."""
    tok, system = model.tokenizer, list(b"Hi. ")
    total = 0.0
    with torch.no_grad():
        for ex in examples:
            imprint = imprint_of(model, system, ex.messages)
            prompt = tok.turn_prompt(ex.exchange[0], system)[0]
            idx = torch.tensor([prompt + tok.reply_tokens(ex.exchange[1])])
            fresh = IdentityState.fresh(model.config)
            states = [[fresh], [replace(fresh, imprint=imprint)]]
            teacher, student = (
                model(idx, model.condition_states(s, [len(system)])).logits[0, len(prompt) - 1 : -1] for s in states
            )
            kl = F.kl_div(F.log_softmax(student, -1), F.log_softmax(teacher, -1), log_target=True, reduction="batchmean")
            total += float(kl)
    return total / len(examples)


def test_training_only_the_gate_moves_only_the_gate_and_lowers_the_distillation() -> None:
    model = tiny()
    model.add_imprint(32, 4)
    config = ReadConfig(steps=30, batch=4, lr=3e-2, rank=4, tokens=32, distractors=1, distill_weight=1.0, log_every=100)
    train_read(model, [list(b"You are kind. "), list(b"Hi. ")], config, phrases())  # a trained read, then its gate
    rng = random.Random(7)
    held_out = [make_example(rng, phrases(), distractors=1, extra_rate=0.0) for _ in range(8)]
    cost = _distillation(model, held_out)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    gated = replace(config, gate=True, adapter=False, distill_weight=1000.0, lr=5e-2, seed=1)
    history = train_read(model, [list(b"You are kind. "), list(b"Hi. ")], gated, phrases())
    changed = {n for n, p in model.named_parameters() if n not in before or not torch.equal(p, before[n])}
    assert changed and all("imprint_gate" in n for n in changed)
    assert all("gate_bias" in h and "gate_weight" in h for h in history)
    # the distillation outweighing the answer: ordinary replies learn to shut the entries and the adapter
    assert cost > 0 and _distillation(model, held_out) < 0.5 * cost


def test_gate_training_needs_something_to_train() -> None:
    model = tiny()
    model.add_imprint(24, 4)
    with pytest.raises(ValueError, match="nothing to train"):
        train_read(model, [], ReadConfig(steps=1, adapter=False), phrases())
    with pytest.raises(ValueError, match="no imprint"):
        tiny().add_imprint_gate()


def test_a_model_without_adapter_refuses_read_training() -> None:
    with pytest.raises(ValueError, match="add_imprint"):
        train_read(tiny(), [], ReadConfig(steps=1), phrases())


def test_imprint_of_keeps_no_text() -> None:
    model = tiny()
    model.add_imprint(24, 0)
    imprint = imprint_of(model, [], ("I am Ox, hi", "sky?"))
    assert isinstance(imprint, Imprint) and imprint.used > 0 and bool((imprint.token == -1).all())
    assert {s.turn for s in imprint.spans()} <= {0, 1}


def test_messages_read_in_padded_passes_as_each_alone() -> None:
    model = tiny()
    model.add_imprint(24, 0, kinds_layer=1)
    tok = model.tokenizer
    systems = [list(b"sys "), list(b"a longer persona prompt ")]
    conversations = [("I am Ox, hi", "sky?", "my pet is a Yak"), ("rain.",), ("hello there, my city is Emu town",)]
    prompts = [tok.turn_prompt(m, systems[i % 2]) for i, c in enumerate(conversations) for m in c]
    with torch.no_grad():
        for (tokens, (start, end)), (nll, words) in zip(prompts, message_reads(model, prompts, rows=4), strict=True):
            one = model.read_words(torch.tensor([tokens[: end - 1]]), logits=True)
            assert one.logits is not None and one.kinds is not None and words.kinds is not None
            assert words.keys.shape == one.keys.shape and nll.shape == (end - 1 - start,)
            torch.testing.assert_close(words.keys, one.keys, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(words.values, one.values, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(words.kinds, one.kinds, atol=1e-4, rtol=1e-4)
            said = torch.tensor(tokens[start : end - 1])[:, None]
            expected = -F.log_softmax(one.logits[start - 1 : end - 2], -1).gather(-1, said)[:, 0]
            torch.testing.assert_close(nll, expected, atol=1e-4, rtol=1e-4)
    # a conversation imprinted among others keeps what it keeps alone, span for span
    together = imprints_of(model, [systems[i % 2] for i in range(3)], conversations)
    for i, (conversation, imprint) in enumerate(zip(conversations, together, strict=True)):
        alone = [after for after, _ in imprint_turns(model, systems[i % 2], conversation)][-1]
        assert imprint.used == alone.used > 0
        assert [(s.turn, s.offset, s.length, s.kind) for s in imprint.spans()] == [
            (s.turn, s.offset, s.length, s.kind) for s in alone.spans()
        ]
    with pytest.raises(ValueError, match="lengths"):
        model.read_rows(torch.zeros(2, 5, dtype=torch.long), [5, 6])
    # what the kind tagger reads of each message: in padded passes sorted by length, as each alone and in order
    for rows in (1, 3):
        inputs = message_inputs(model, prompts, 1, rows=rows)
        assert len(inputs) == len(prompts)
        for (tokens, (start, end)), got in zip(prompts, inputs, strict=True):
            with torch.no_grad():
                alone = model.layer_input(torch.tensor([tokens[: end - 1]]), 1)[start:]
            assert got.shape == (end - 1 - start, model.config.n_embd)
            torch.testing.assert_close(got, alone, atol=1e-4, rtol=1e-4)


def test_the_write_reads_chat_typing() -> None:
    """A turn's write leaves out a request after a greeting and ends a clause at an emoji, as its rules read the
    message's completed characters."""
    model = tiny()
    model.add_imprint(40, 0)
    tok = model.tokenizer
    imprint = [after for after, _ in imprint_turns(model, [], ["hii can u help me plan a trip"], keep_text=True)][-1]
    assert imprint.used == 0
    imprint = [after for after, _ in imprint_turns(model, [], ["night shift 😵 im in cebu"], keep_text=True)][-1]
    assert [tok.decode(list(s.tokens or ())) for s in imprint.spans()] == ["night shift 😵", " im in cebu"]


def test_token_kinds_label_the_clauses_characters() -> None:
    tok = ByteTokenizer()
    message = "hi, I am Ox, bye"
    labels = token_kinds(tok, message, ((4, 11, "name"),))
    assert "".join(message[i] for i, k in enumerate(labels) if k) == "I am Ox"
    assert {k for k in labels if k} == {KINDS.index("name")}


def test_the_kind_tagger_learns_which_tokens_state_a_fact() -> None:
    untrained = tiny()
    untrained.add_imprint(32, 0, kinds_layer=1)
    before = train_kinds(untrained, [list(b"sys ")], phrases(), messages=80, steps=0)
    model = tiny()
    model.add_imprint(32, 0, kinds_layer=1)
    report = train_kinds(model, [list(b"sys ")], phrases(), messages=80, steps=150)
    # a random two-layer model: every token is "unknown" untrained; trained, half the fact tokens get their kind
    assert before["fact_token_recall"] == 0.0 and before["false_fact_rate"] == 0.0
    assert report["fact_token_recall"] > 0.4 and report["accuracy"] > before["accuracy"] and report["loss"] < before["loss"]
    words = model.read_words(torch.tensor([list(b"I am Emu")]))
    assert words.kinds is not None and words.kinds.shape == (8, len(KINDS))
    torch.testing.assert_close(words.kinds.sum(-1), torch.ones(8))
    with pytest.raises(ValueError, match="kind tagger"):
        train_kinds(tiny(), [[]], phrases())


def test_natural_statements_hold_the_facts_the_tagger_knows() -> None:
    from sia.learn.natural import _user

    message = "I'm Ana, I keep bees. My sister Eva lives in Porto."
    facts = [
        {"kind": "name", "value": "Ana", "accept": ["Ana"], "message": 0, "clause": "I'm Ana"},
        {"kind": "hobby", "value": "beekeeping", "accept": ["bees"], "message": 0, "clause": "I keep bees"},
        {"kind": "relative", "value": "Eva", "accept": ["Eva"], "message": 0, "clause": "My sister Eva"},  # not a tagger kind
    ]
    questions = [{"kind": k, "text": "?"} for k in ("name", "hobby", "relative")]
    user = _user({"id": "u", "messages": [message, "bye"], "facts": facts, "questions": questions}, "test")
    rows = natural_statements([user])
    assert [m for m, _ in rows] == [message, "bye"] and rows[1][1] == ()
    assert [(message[a:b], kind) for a, b, kind in rows[0][1]] == [("I'm Ana", "name"), ("I keep bees", "hobby")]
    # the ask head's: each question with the kind it asks (none for a kind the tagger does not know), each message none
    assert natural_asks([user]) == [("?", KINDS.index("name")), ("?", KINDS.index("hobby")), ("?", 0), (message, 0), ("bye", 0)]
    # in lower case too where asked, the spans the same; a message without capitals is not repeated
    lower = natural_statements([user], lower=True)
    assert lower[:2] == rows and lower[2:] == [(message.lower(), rows[0][1])]
    assert [(message.lower()[a:b], kind) for a, b, kind in lower[2][1]] == [("i'm ana", "name"), ("i keep bees", "hobby")]
    assert natural_asks([user], lower=True)[5:] == [(message.lower(), 0)]
    assert lowered("İstanbul, I'm Ana") == "İstanbul, i'm ana"  # a character whose lower case is longer stays


def _hand_written(uid: str, name: str, pet: str) -> Any:
    """A natural-set user telling a name, a pet (then another one), and a relative's name (no answers for that kind)."""
    from sia.learn.natural import _user

    messages = [f"hey, {name} here. we got a {pet} lately", "oh and the old one went to my sister Eva", "actually a Yak now"]
    facts = [
        {"kind": "name", "value": name, "accept": [name], "message": 0, "clause": f"{name} here"},
        {"kind": "pet", "value": pet, "accept": [pet], "message": 0, "clause": f"a {pet}"},
        {"kind": "relative", "value": "Eva", "accept": ["Eva"], "message": 1, "clause": "my sister Eva"},
        {"kind": "pet", "value": "Yak", "accept": ["Yak"], "message": 2, "clause": "a Yak now", "corrects": pet},
    ]
    questions = [
        {"kind": "name", "text": "who am I?"},
        {"kind": "pet", "text": "my animal?"},
        {"kind": "relative", "text": "sis?"},
    ]
    return _user({"id": uid, "messages": messages, "facts": facts, "questions": questions}, "test")


def test_a_natural_example_asks_one_of_the_users_questions_and_answers_with_the_newest_value() -> None:
    rng, p = random.Random(0), phrases()
    user = _hand_written("u", "Zuzu", "Emu")
    seen = set()
    for _ in range(30):
        ex = natural_example(rng, p, user, distractors=2)
        assert ex is not None
        assert ex.messages[:3] == user.messages and set(ex.messages[3:]) <= set(p.chitchat) and len(ex.messages) <= 5
        # the relative's question has no answers in the tables; the pet's answer is the correction, never the older pet
        assert (ex.question, ex.answer) in {("who am I?", "Zuzu."), ("my animal?", "Yak.")}
        assert ex.facts == {"name": "Zuzu", "pet": "Yak", "relative": "Eva"} and ex.clauses == {}
        seen.add(ex.question)
    assert seen == {"who am I?", "my animal?"}
    only_relative = replace(user, questions=tuple(q for q in user.questions if q.kind == "relative"))
    assert natural_example(rng, p, only_relative, distractors=2) is None


def test_the_read_learns_from_hand_written_users_at_the_rate_asked() -> None:
    """With natural_rate 1 every example is a hand-written user's, whose words are nowhere in the phrase tables: the
    answer loss falls on them; at rate 0 the generated examples are those of a run without them."""
    users = [_hand_written(f"u{i}", name, "Emu") for i, name in enumerate(("Qwix", "Blor", "Fenk", "Trab"))]
    model = tiny()
    model.add_imprint(32, 4)
    config = ReadConfig(steps=30, batch=4, lr=3e-2, rank=4, tokens=32, distractors=0, distill_weight=0.0, natural_rate=1.0)
    history = train_read(model, [list(b"sys ")], config, phrases(), natural=users)
    assert sum(h["answer"] for h in history[-5:]) / 5 < history[0]["answer"] - 0.4
    with pytest.raises(ValueError, match="natural users"):
        train_read(tiny_with_read(), [[]], replace(config, steps=1), phrases())
    with pytest.raises(ValueError, match="share"):
        train_read(tiny_with_read(), [[]], replace(config, steps=1, natural_rate=1.5), phrases(), natural=users)
    plain = replace(config, steps=2, natural_rate=0.0, distill_weight=1.0)
    runs = [train_read(tiny_with_read(), [list(b"sys ")], plain, phrases(), natural=own) for own in ((), users)]
    assert [h["answer"] for h in runs[0]] == [h["answer"] for h in runs[1]]


def tiny_with_read() -> LlamaModel:
    model = tiny()
    model.add_imprint(32, 4)
    return model


def test_the_read_trains_with_the_entries_moved_by_what_the_question_asks() -> None:
    """Over a model with an ask head, the trainer's conditioning is a turn's: the entries of the asked kind raised."""
    from sia.learn.imprint_read import _conditioned

    model = with_trained_like_read()
    model.add_kind_tagger(1)
    model.add_ask_head(6.0)
    assert model.imprint_ask is not None
    with torch.no_grad():  # a head that reads every message as asking for the city
        model.imprint_ask.bias.zero_()
        model.imprint_ask.bias[KINDS.index("city")] = 40.0
    imprint = _labelled(model, ["name", "city"])
    asked = _conditioned(model, [imprint], [3], ["where do I live?"])
    turn = model.condition_states([replace(IdentityState.fresh(model.config), imprint=imprint)], [3],
                                  [message_tokens(model.tokenizer, "where do I live?")])  # fmt: skip
    unasked = _conditioned(model, [imprint], [3])
    for a, b, c in zip(asked.layers, turn.layers, unasked.layers, strict=True):
        assert a is not None and b is not None and c is not None
        torch.testing.assert_close(a.slot_key, b.slot_key)
    assert not torch.equal(asked.layers[1].slot_key, unasked.layers[1].slot_key)  # type: ignore[union-attr]


def test_the_kind_tagger_learns_from_hand_written_messages() -> None:
    """Messages written by hand join the generated ones (counted as often as asked) and teach their own wording: a
    phrasing no template holds is labelled with its kind only by the tagger that saw it."""
    own = [("zq vx wk jj", ((0, 11, "pet"),)), ("hello there", ())]
    labels, tokens = {}, {}
    for repeat in (0, 40):
        model = tiny()
        model.add_imprint(32, 0, kinds_layer=1)
        report = train_kinds(model, [list(b"sys ")], phrases(), messages=40, steps=150, natural=own if repeat else (),
                             natural_repeat=max(repeat, 1))  # fmt: skip
        labels[repeat] = model.read_words(torch.tensor([list(b"zq vx wk jj")])).kinds.argmax(-1)  # type: ignore[union-attr]
        tokens[repeat] = report["tokens"]
    assert tokens[40] == tokens[0] + 40 * 22  # the two messages' 22 bytes, 40 times
    assert (labels[40] == KINDS.index("pet")).float().mean() > 0.8
    assert (labels[0] == KINDS.index("pet")).float().mean() < 0.5
    with pytest.raises(ValueError, match="natural_repeat"):
        train_kinds(model, [[]], phrases(), natural=own, natural_repeat=0)


def _labelled(model: LlamaModel, kinds: list[str]) -> Imprint:
    """An imprint of the tiny model with one span per kind in ``kinds`` (KINDS names), four entries each."""
    imprint = imprint_of(model, list(b"sys"), ("I am Ox and so on",))
    spans = imprint.spans()
    assert len(spans) >= 1
    N = imprint.capacity
    span = torch.full((N,), -1, dtype=torch.int32)
    kind = torch.zeros(N, dtype=torch.int32)
    for i, name in enumerate(kinds):
        span[4 * i : 4 * i + 4] = i
        kind[4 * i : 4 * i + 4] = KINDS.index(name)
    return replace(imprint, span=span, kind=kind, token=torch.where(span >= 0, 65, -1).int())


def test_the_entry_bias_raises_the_asked_kind_lowers_the_others_and_leaves_unknown_alone() -> None:
    model = tiny()
    model.add_imprint(24, 4, kinds_layer=1)
    model.add_ask_head(3.0)
    kind = torch.tensor([[KINDS.index("city"), KINDS.index("name"), 0, 0]])
    asks_city = torch.zeros(1, len(KINDS))
    asks_city[0, KINDS.index("city")] = 1.0
    none = torch.zeros(1, len(KINDS))
    none[0, 0] = 1.0
    bias = model.entry_bias(kind, asks_city)
    assert bias is not None and bias.tolist() == [[3.0, -3.0, 0.0, 0.0]]
    assert model.entry_bias(kind, none).tolist() == [[0.0, 0.0, 0.0, 0.0]]  # type: ignore[union-attr]
    likely = 0.6 * asks_city + 0.4 * none  # more likely than not it asks for the city: +1.8 there, -1.8 on the name
    torch.testing.assert_close(model.entry_bias(kind, likely), torch.tensor([[1.8, -1.8, 0.0, 0.0]]))
    unlikely = 0.4 * asks_city + 0.6 * none  # more likely it asks for none ("What is the capital of France?")
    assert model.entry_bias(kind, unlikely).tolist() == [[0.0, 0.0, 0.0, 0.0]]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="asked must be"):
        model.entry_bias(kind, torch.ones(1, 3))
    model.add_ask_head(0.0)
    assert model.imprint_ask is None and model.entry_bias(kind, asks_city) is None


def test_an_untrained_ask_head_asks_for_nothing_and_changes_no_logit() -> None:
    model = with_trained_like_read()
    model.add_kind_tagger(1)
    imprint = _labelled(model, ["name", "city"])
    state = replace(IdentityState.fresh(model.config), imprint=imprint)
    idx = torch.tensor([list(b"sys where do I live?")])
    with torch.no_grad():
        plain = model(idx, model.condition_states([state], [3])).logits
        model.add_ask_head(4.0)
        asked = model.asked_kinds([list(b"where do I live?")])
        unasked = model(idx, model.condition_states([state], [3], [list(b"where do I live?")])).logits
    assert asked.shape == (1, len(KINDS)) and float(asked[0, 0]) > 1 - 1e-12
    torch.testing.assert_close(unasked, plain, atol=1e-5, rtol=0)


def test_asking_for_a_kind_moves_attention_to_its_entries_and_a_fresh_identity_stays_the_base_model() -> None:
    model = with_trained_like_read()
    model.add_kind_tagger(1)
    model.add_ask_head(6.0)
    assert model.imprint_ask is not None
    imprint = _labelled(model, ["name", "city"])
    fresh = IdentityState.fresh(model.config)
    idx = torch.tensor([list(b"sys where do I live?")])
    with torch.no_grad():  # a head that reads every message as asking for the city
        model.imprint_ask.bias.zero_()
        model.imprint_ask.bias[KINDS.index("city")] = 40.0
        message = [list(b"where do I live?")]
        base = model(idx, model.condition_states([fresh], [3])).logits
        fresh_asked = model(idx, model.condition_states([fresh], [3], message)).logits
        cond = model.condition_states([replace(fresh, imprint=imprint)], [3], message)
        plain = model.condition_states([replace(fresh, imprint=imprint)], [3])
        asked, unasked = model(idx, cond).logits, model(idx, plain).logits
    torch.testing.assert_close(fresh_asked, base, atol=1e-5, rtol=0)  # no entries: nothing to move
    assert (asked - unasked).abs().max() > 1e-3
    # the bias sits in each entry key's bias column (the query's constant 1): +6 on the city's span, -6 on the name's
    attn = model.attentions[1]
    col = attn.d + attn.mid
    S = model.config.self_slots
    moved = cond.layers[1].slot_key[0, 0, S:, col] - plain.layers[1].slot_key[0, 0, S:, col]  # type: ignore[union-attr]
    torch.testing.assert_close(moved[:8], torch.tensor([-6.0] * 4 + [6.0] * 4))
    assert bool((moved[8:] == 0).all())
    with pytest.raises(ValueError, match="one message per state"):
        model.condition_states([fresh], [3], [[1], [2]])


def test_the_ask_head_learns_what_kind_a_message_asks_about() -> None:
    model = tiny()
    model.add_imprint(24, 0, kinds_layer=1)
    with pytest.raises(ValueError, match="ask head"):
        train_asks(model, phrases())
    model.add_ask_head(2.0)
    p = phrases()
    p = replace(p, questions={k: (f"{k}?", f"my {k}?", f"what {k}", f"so, {k}?", f"{k} again?") for k in p.questions})
    rng = random.Random(0)
    data = ask_messages(rng, p, 200)
    assert {k for _, k in data} >= {0, KINDS.index("name")} and sum(k == 0 for _, k in data) > 60
    report = train_asks(model, p, messages=400, steps=150)
    # unseen wordings of a random two-layer model's questions: well above the one-in-eleven of a guess
    assert report["asked_kind_recall"] > 0.3 and report["held_out_accuracy"] > 0.5, report
    asked = model.asked_kinds([message_tokens(model.tokenizer, "colour?"), message_tokens(model.tokenizer, "rain.")])
    torch.testing.assert_close(asked.sum(-1), torch.ones(2))
    assert int(asked[0].argmax()) == KINDS.index("colour") and int(asked[1].argmax()) == 0


def test_message_tokens_are_the_turns_own() -> None:
    from sia.identity.turn import TurnRequest, turn_prompt

    tok = ByteTokenizer()
    model = tiny()
    state = IdentityState.fresh(model.config)
    prompt = turn_prompt(tok, TurnRequest(state, "where do I live?", None, (1, 2, 3)))  # type: ignore[arg-type]
    assert prompt.message == message_tokens(tok, "where do I live?") == list(b"where do I live?")


def test_a_message_is_asked_about_the_same_in_a_batch_as_alone() -> None:
    model = tiny()
    model.add_imprint(24, 0, kinds_layer=1)
    model.add_ask_head(2.0)
    assert model.imprint_ask is not None
    with torch.no_grad():
        model.imprint_ask.weight.normal_(0, 0.5)  # a head that tells messages apart
        model.imprint_ask.bias.zero_()
    rows = [list(b"where do I live?"), list(b"hi"), list(b"what is my name, again?")]
    together = model.asked_kinds(rows)
    alone = torch.cat([model.asked_kinds([r]) for r in rows])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=0)  # the padding after a shorter row plays no part
    assert (together[0] - together[1]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="at least one token"):
        model.asked_kinds([[]])


def test_a_reply_that_recalls_the_users_facts_is_decoded_at_the_recall_temperature_in_a_batch_as_alone() -> None:
    model = with_trained_like_read()
    model.add_kind_tagger(1)
    model.add_ask_head(2.0)
    assert model.imprint_ask is not None
    # a head that reads "where do I live?" as asking for the city and "hi there" as asking for none
    rows = [list(b"where do I live?"), list(b"hi there")]

    def asked_kinds(messages: list[list[int]]) -> Tensor:
        asked = [KINDS.index("city") if m == rows[0] else 0 for m in messages]
        return F.one_hot(torch.tensor(asked), len(KINDS)).float()

    model.asked_kinds = asked_kinds  # type: ignore[method-assign,assignment]
    kept = replace(IdentityState.fresh(model.config), imprint=_labelled(model, ["name", "city"]))
    fresh = IdentityState.fresh(model.config)
    cond = model.condition_states([kept, kept, fresh], [3, 3, 3], [rows[0], rows[1], rows[0]])
    # asked about the user with an imprint to answer from; asked nothing; asked, with nothing imprinted
    assert cond.recalls is not None and cond.recalls.tolist() == [True, False, False]
    assert model.condition_states([kept], [3]).recalls is None  # no message: nothing asked
    prompt = list(b"sys ") + rows[0]
    hot = SamplingParams(max_new_tokens=12, temperature=1.5, seed=5, recall_temperature=0.0)
    greedy = generate(model, [prompt], model.condition_states([kept], [4], [rows[0]]), replace(hot, temperature=0.0))
    recalled = generate(model, [prompt], model.condition_states([kept], [4], [rows[0]]), hot)
    sampled = generate(model, [prompt], model.condition_states([kept], [4], [rows[0]]), replace(hot, recall_temperature=None))
    assert recalled[0].tokens == greedy[0].tokens and sampled[0].tokens != greedy[0].tokens
    # in a batch, the recalling row is decoded greedily and the other at its own temperature, each as it is alone
    prompts = [prompt, list(b"sys ") + rows[1]]
    together = generate(model, prompts, model.condition_states([kept, kept], [4, 4], rows), hot)
    alone = [generate(model, [p], model.condition_states([kept], [4], [m]), hot)[0] for p, m in zip(prompts, rows, strict=True)]
    assert [g.tokens for g in together] == [g.tokens for g in alone] and together[0].tokens == greedy[0].tokens
    batch = DecodeBatch(model)
    handles = batch.join_many(prompts, model.condition_states([kept, kept], [4, 4], rows), [hot, hot])
    while not all(h in batch.done for h in handles):
        batch.sample()
        batch.advance()
    assert [batch.take(h).tokens for h in handles] == [g.tokens for g in alone]


def _asking_for_colour(**config: Any) -> LlamaModel:
    """The trained-like tiny model with a kind tagger and an ask head that takes every message for a question about
    the user's favourite colour; ``config`` set on its config (imprint_untold)."""
    model = with_trained_like_read()
    model.add_kind_tagger(1)
    model.add_ask_head(2.0)
    assert model.imprint_ask is not None
    with torch.no_grad():
        model.imprint_ask.weight.zero_()
        model.imprint_ask.bias.zero_()
        model.imprint_ask.bias[KINDS.index("colour")] = 40.0
    model.config = replace(model.config, **config)
    return model


def test_a_question_about_a_kind_the_user_never_told_reads_no_imprint_and_says_so() -> None:
    """Asked for the favourite colour with only a name and a city imprinted, the row is conditioned as a fresh
    identity's imprint, bit for bit, and its reply is the untold reply, whole, then it ends; with a colour imprinted,
    or the kind not listed in config.imprint_untold, the imprint answers as before; a fresh identity is untouched. In a
    batch each row decodes as it does alone."""
    model = _asking_for_colour(imprint_untold=["colour"])
    question = "what colour do I like?"
    rows = [list(question.encode())] * 2
    untold = replace(IdentityState.fresh(model.config), imprint=_labelled(model, ["name", "city"]))
    told = replace(IdentityState.fresh(model.config), imprint=_labelled(model, ["name", "colour"]))
    fresh = IdentityState.fresh(model.config)
    cond = model.condition_states([untold, told], [3, 3], rows)
    assert cond.untold == ("colour", "")
    blank = model.condition_states([fresh], [3], rows[:1])
    assert blank.untold is None  # nothing imprinted: the base model, asked nothing
    own = model.condition_states([told], [3], rows[:1])
    for layer, alone, theirs in zip(cond.layers, blank.layers, own.layers, strict=True):
        assert layer is not None and alone is not None and theirs is not None
        assert torch.equal(layer.slot_key[0], alone.slot_key[0])
        assert torch.equal(layer.slot_key[1], theirs.slot_key[0])
    prompt = list(b"sys ") + rows[0]
    params = SamplingParams(max_new_tokens=120, temperature=0.0, reply_to=question)
    said, answered = generate(model, [prompt, prompt], model.condition_states([untold, told], [4, 4], rows), params)
    assert said.text == untold_reply("colour", question) and said.finish_reason == "stop"
    assert said.tokens == [*model.tokenizer.encode(said.text), model.tokenizer.end_id]
    alone = generate(model, [prompt], model.condition_states([told], [4], rows[:1]), params)[0]
    assert answered.tokens == alone.tokens and answered.text != said.text
    terse = replace(params, lowercase=True, max_sentences=1)  # bolt's form: one sentence, in lower case
    short = generate(model, [prompt], model.condition_states([untold], [4], rows[:1]), terse)[0]
    assert short.text == "i don't think you've told me your favourite colour." and short.finish_reason == "stop"
    batch = DecodeBatch(model)
    handles = batch.join_many([prompt, prompt], model.condition_states([untold, told], [4, 4], rows), [params, params])
    while not all(h in batch.done for h in handles):
        batch.sample()
        batch.advance()
    assert [batch.take(h).tokens for h in handles] == [said.tokens, alone.tokens]
    unlisted = _asking_for_colour()  # imprint_untold off: the imprint is read as before
    assert unlisted.condition_states([untold], [3], rows[:1]).untold is None


def test_an_unlabelled_clause_naming_a_colour_keeps_the_untold_reply_away() -> None:
    """The tagger leaves a clause like "lilac is me" unlabelled; held with its text, the persona does not say the user
    never told a colour, and the row reads its imprint as it would without the untold rule. A name alone, or the same
    clause kept without its text (privacy), is still untold, unless the labels alone do not decide the colour
    (config.imprint_untold_by_label without it): then the clause kept without its text is read."""
    model = _asking_for_colour(imprint_untold=["colour"])
    rows = [list(b"what colour do I like?")] * 3
    named = _told(model, [("I am Ox", "name", 0), ("lilac is me", "unknown", 1)])
    nameless = _told(model, [("I am Ox", "name", 0), ("kettle is me", "unknown", 1)])
    private = replace(named, token=torch.full_like(named.token, -1))
    states = [replace(IdentityState.fresh(model.config), imprint=i) for i in (named, nameless, private)]
    cond = model.condition_states(states, [3, 3, 3], rows)
    assert cond.untold == ("", "colour", "colour")
    read = _asking_for_colour()  # no untold rule: the imprint read as it is
    alone, plain = model.condition_states(states[:1], [3], rows[:1]), read.condition_states(states[:1], [3], rows[:1])
    assert alone.untold is None
    for ours, theirs in zip(alone.layers, plain.layers, strict=True):
        assert ours is not None and theirs is not None
        assert torch.equal(ours.slot_key, theirs.slot_key) and torch.equal(ours.slot_value, theirs.slot_value)
    model.config = replace(model.config, imprint_untold_by_label=[])
    assert model.condition_states(states, [3, 3, 3], rows).untold == ("", "colour", "")
    model.config = replace(model.config, imprint_untold_by_label=["colour"])
    assert model.condition_states(states, [3, 3, 3], rows).untold == ("", "colour", "colour")
    with pytest.raises(ValueError, match="imprint_untold_by_label"):
        replace(model.config, imprint_untold_by_label=["pet"])  # not a kind of imprint_untold


def test_the_words_of_a_closed_kind_are_named() -> None:
    assert names_kind("colour", "lilac is everything to me")
    assert names_kind("colour", "my bottle GREEN jumper")
    assert names_kind("colour", "fav colour? ochre")
    assert not names_kind("colour", "my favourite colour")  # the kind's word, no value
    assert not names_kind("colour", "I'm Ruby and I love honey")  # names that are as often something else
    assert not names_kind("colour", "greenhouse")  # whole words only
    assert names_kind("pet", "My sphynx cat hates the cold") and names_kind("pet", "two guinea pigs run my home")
    assert names_kind("pet", "my buncho sits on my shoulder, a Java sparrow")
    assert not names_kind("pet", "I walk past the catwalk every day")  # whole words only
    assert not names_kind("city", "I live in Lisbon")  # a kind without a list of its own words


def _three_rows(kinds: list[list[str]]) -> ImprintEntries:
    """Imprint entries of three rows, two places each: row r holds one entry per name in ``kinds[r]`` (KINDS names), in
    a span of its own."""
    filled = torch.tensor([[i < len(row) for i in range(2)] for row in kinds])
    kind = torch.tensor([[KINDS.index(row[i]) if i < len(row) else 0 for i in range(2)] for row in kinds])
    span = torch.where(filled, torch.arange(2).expand(3, 2), -1)
    zeros = torch.zeros(3, 1, 1, 2, 2)
    return ImprintEntries(keys=zeros, values=zeros, filled=filled, kind=kind, token=torch.full((3, 2), -1), span=span)


def test_the_untold_rule_needs_a_sure_ask_and_entries() -> None:
    entries = _three_rows([["name", "unknown"], ["colour"], []])
    sure = torch.zeros(3, len(KINDS))
    sure[:, KINDS.index("colour")] = 1.0
    # row 0: nothing of the colour held; row 1: a colour held; row 2: nothing held at all (a fresh identity)
    assert entries.untold(sure, ["colour"]) == ["colour", "", ""]
    assert entries.untold(sure, ["pet"]) == ["", "", ""]
    unsure = torch.zeros(3, len(KINDS))
    unsure[:, 0], unsure[:, KINDS.index("colour")] = 1 - UNTOLD_SURE + 0.01, UNTOLD_SURE - 0.01
    assert entries.untold(unsure, ["colour"]) == ["", "", ""]
    with pytest.raises(ValueError, match="asked must be"):
        entries.untold(torch.ones(3, 2), ["colour"])


def test_the_untold_reply_takes_the_personas_form_and_is_checked() -> None:
    assert untold_reply("colour", "What's my favourite colour?") == (
        "I don't think you've told me your favourite colour. What is it?"
    )
    assert untold_reply("colour", "whats my favorite color") == "I don't think you've told me your favorite color. What is it?"
    assert untold_reply("colour", "Which colour?", address=", sir") == (
        "I don't think you've told me your favourite colour, sir. What is it?"
    )
    assert untold_reply("name", "Who am I?", exclaim=True) == "I don't think you've told me your name! What is it?"
    with pytest.raises(ValueError, match="untold"):
        untold_reply("birthday", "When is my birthday?")
    with pytest.raises(ValueError, match="untold"):
        SamplingParams(untold="birthday")


def test_a_question_about_a_kind_told_as_a_clause_opens_by_saying_it_back() -> None:
    """Asked for the favourite colour with something imprinted and the kind listed in config.imprint_echo, the reply
    opens "You told me you" and the model goes on from there, conditioned as before (the same slot keys); the persona's
    forms hold (lower case); with a fresh identity, or the kind not listed, the reply is the model's own. In a batch each
    row decodes as it does alone."""
    model = _asking_for_colour(imprint_echo=["colour"])
    question = "what colour do I like?"
    rows = [list(question.encode())] * 2
    told = replace(IdentityState.fresh(model.config), imprint=_labelled(model, ["name", "city"]))  # no colour labelled
    fresh = IdentityState.fresh(model.config)
    cond = model.condition_states([told, fresh], [3, 3], rows)
    assert cond.echo == ("colour", "")  # nothing imprinted: the base model, no opening
    plain = _asking_for_colour()  # imprint_echo off: the same conditioning, no opening
    unopened = plain.condition_states([told], [3], rows[:1])
    assert unopened.echo is None
    for layer, theirs in zip(cond.layers, unopened.layers, strict=True):
        assert layer is not None and theirs is not None and torch.equal(layer.slot_key[0], theirs.slot_key[0])
    prompt = list(b"sys ") + rows[0]
    params = SamplingParams(max_new_tokens=30, temperature=0.0)
    opened, own = generate(model, [prompt, prompt], model.condition_states([told, fresh], [4, 4], rows), params)
    opening = model.tokenizer.encode(ECHO_OPENING)
    assert opened.text.startswith(ECHO_OPENING) and opened.tokens[: len(opening)] == opening
    # the opening is written, then the model goes on: the rest is what it decodes after those tokens in the prompt
    after = generate(plain, [prompt + opening], plain.condition_states([told], [4], rows[:1]), params)[0]
    assert opened.tokens[len(opening) :] == after.tokens[: len(opened.tokens) - len(opening)]
    alone = generate(model, [prompt], model.condition_states([fresh], [4], rows[:1]), params)[0]
    assert own.tokens == alone.tokens and not own.text.startswith(ECHO_OPENING)
    terse = generate(model, [prompt], model.condition_states([told], [4], rows[:1]), replace(params, lowercase=True))[0]
    assert terse.text.startswith(ECHO_OPENING.lower())
    batch = DecodeBatch(model)
    handles = batch.join_many([prompt, prompt], model.condition_states([told, fresh], [4, 4], rows), [params, params])
    while not all(h in batch.done for h in handles):
        batch.sample()
        batch.advance()
    assert [batch.take(h).tokens for h in handles] == [opened.tokens, own.tokens]


def test_a_jobs_echo_leans_to_what_the_user_said_after_i(smollm2_cache: Path) -> None:
    """Where the reply says back a job, the first token after "You told me you" leans by ECHO_LEAN to the tokens that go
    on from "I" in the row's imprinted spans, as said after "you" ("I fix cars": " fix"; "I'm a nurse": "'re"): a
    word the model put 1.5 below its likeliest comes first. Not across spans, not from a span labelled as a name ("I'm
    Eirik"), and no words for a hobby's echo or a row that does not echo."""
    model = load_model(DEFAULT_CHECKPOINT, cache_dir=smollm2_cache)
    tok = model.tokenizer
    spans = [tok.encode("I fix cars"), tok.encode(" and I'm a nurse"), tok.encode(" I"), tok.encode(" sing")]
    token = torch.tensor([[t for ids in spans for t in ids]] * 3)
    span = torch.tensor([[i for i, ids in enumerate(spans) for _ in ids]] * 3)
    N = token.shape[1]
    entries = ImprintEntries(torch.zeros(3, 1, 1, N, 1), torch.zeros(3, 1, 1, N, 1), span >= 0, span * 0, token, span)
    fix, re_ = tok.encode(" fix"), tok.encode("'re")
    assert len(fix) == len(re_) == 1
    assert model._echo_words(entries, ["job", "hobby", ""]) == ((fix[0], re_[0]), (), ())
    named = entries.kind.clone()
    named[:, span[0] == 1] = KINDS.index("name")  # " and I'm a nurse" labelled as the user's name
    assert model._echo_words(replace(entries, kind=named), ["job", "", ""]) == ((fix[0],), (), ())
    assert model._echo_words(entries, ["hobby", "", ""]) is None

    def first_after_opening(words: tuple[int, ...]) -> str:
        params = SamplingParams(max_new_tokens=8, temperature=0.0, echo="job", echo_words=words)
        row = ReplyDecoder(params, torch.device("cpu"), tok)
        logits = torch.zeros(tok.vocab_size)
        logits[tok.encode(" work")[0]], logits[fix[0]] = 9.0, 9.0 - ECHO_LEAN + 0.5
        while not row.text.startswith(ECHO_OPENING) or row.text == ECHO_OPENING:
            row.push(row.sample(logits, params), params, tok.end_ids)
        return row.text

    assert first_after_opening((fix[0],)) == ECHO_OPENING + " fix"
    assert first_after_opening(()) == ECHO_OPENING + " work"
    with pytest.raises(ValueError, match="echo_words"):
        SamplingParams(echo_words=(-1,))


def test_the_echo_rule_needs_a_fact_asked_and_something_held() -> None:
    entries = _three_rows([["name", "job"], ["name"], []])
    asked = torch.zeros(3, len(KINDS))
    asked[:, KINDS.index("job")] = 1.0
    # row 0: a job held; row 1: a name held and nothing labelled a job; row 2: nothing held at all (a fresh identity)
    assert entries.echoed(asked, ["job", "hobby"]) == ["job", "job", ""]
    assert entries.echoed(asked, ["hobby"]) == ["", "", ""]
    doubtful = torch.zeros(3, len(KINDS))
    doubtful[:, 0], doubtful[:, KINDS.index("job")] = 0.5, 0.4  # as likely no fact as a job: nothing is recalled
    assert entries.echoed(doubtful, ["job"]) == ["", "", ""]
    with pytest.raises(ValueError, match="asked must be"):
        entries.echoed(torch.ones(3, 2), ["job"])
    with pytest.raises(ValueError, match="echo"):
        SamplingParams(echo="birthday")
    echoing = Conditioning(layers=[], self_state=torch.zeros(2, 1), echo=("job", ""))
    params = SamplingParams()
    assert row_params([params, params], echoing) == [replace(params, echo="job"), params]


def _told(model: LlamaModel, spans: list[tuple[str, str, int]]) -> Imprint:
    """An imprint of the tiny model (byte tokens) holding ``spans`` in this entry order: (the clause's text, its kind
    (a KINDS name), the turn that said it), each at offset 0 of its turn; token ids kept."""
    imprint = imprint_of(model, list(b"sys"), ("I am Ox and so on",))
    N = imprint.capacity
    span, kind, token, turn = (torch.full((N,), fill, dtype=torch.int32) for fill in (-1, 0, -1, 0))
    at = 0
    for i, (text, name, said) in enumerate(spans):
        ids = list(text.encode())
        span[at : at + len(ids)], kind[at : at + len(ids)], turn[at : at + len(ids)] = i, KINDS.index(name), said
        token[at : at + len(ids)] = torch.tensor(ids, dtype=torch.int32)
        at += len(ids)
    assert at <= N
    zeros = torch.zeros(N, dtype=torch.int32)
    return replace(imprint, span=span, kind=kind, token=token, turn=turn, offset=zeros, score=zeros.float())


def test_a_message_asking_what_the_persona_knows_of_its_writer_is_told_apart() -> None:
    for asked in (
        "What do you know about me?",
        "tell me what you remember about me",
        "Do you know anything about me?",
        "what have I told you so far?",
        "What did I tell you about myself?",
        "Tell me about myself.",
        "how much do u remember about me",
    ):
        assert about_the_user(asked), asked
    for other in (
        "What did I tell you about my job?",  # one fact: the read answers it
        "I want you to know about me that I hate mornings",  # said, not asked
        "What do you know about Paris?",
        "What's my name?",
        "Tell me about yourself.",
        "Which colour wool should I buy, based on what you know about me?",  # a colour asked on those grounds
    ):
        assert not about_the_user(other), other
    assert spoken_clause(" and I have a cat.") == "I have a cat"
    assert spoken_clause("Hi. I'm Ana,") == "Hi, I'm Ana"  # one sentence in the quote
    assert spoken_clause('so my "favourite" is teal') == "my 'favourite' is teal"
    assert spoken_clause(" ...") == ""
    assert spoken_clause(" You know my name,") == "" and spoken_clause("your cat?") == ""  # said to the persona
    assert recollection_reply(["I'm Ana", "I have a cat"]) == "You've told me: “I'm Ana” and “I have a cat”."
    assert recollection_reply(["I'm Ana"], address=", sir") == "You've told me: “I'm Ana”, sir."
    assert recollection_reply(["I'm Ana", "in Lyon", "a cat"], exclaim=True) == (
        "You've told me: “I'm Ana”, “in Lyon” and “a cat”!"
    )
    for bad in ([], [""], ["two\nlines"]):
        with pytest.raises(ValueError, match="recollect"):
            recollection_reply(bad)
    for value in ("a\n", "a\tb", "x" * 5000, 3):
        with pytest.raises(ValueError, match="recollection"):
            SamplingParams(recollection=value)  # type: ignore[arg-type]


def test_the_recollection_is_the_labelled_clauses_in_the_order_they_were_said() -> None:
    model = with_trained_like_read()
    imprint = _told(model, [(" a cat.", "pet", 1), ("Hi!", "unknown", 0), (" I'm Ox,", "name", 0), ("a cat", "pet", 2)])
    assert imprint.recollection(model.tokenizer.decode) == ["I'm Ox", "a cat"]  # by turn; none twice; no unknown span
    private = replace(imprint, token=torch.where(imprint.span >= 0, -1, -1).int())  # the text not kept
    assert private.recollection(model.tokenizer.decode) == []
    assert Imprint.empty(model.config).recollection(model.tokenizer.decode) == []


def test_a_question_of_two_facts_is_answered_with_the_clauses_of_both_kinds() -> None:
    """ "What's my name and what pet do I have?" (two parts the ask head reads as a name and a pet) is answered with the
    clauses labelled with those kinds, quoted; where one kind has none, or the parts ask one kind, or the ask head
    reads no fact, the model answers as before."""
    assert asked_parts("What's my name and what do I do?") == ["What's my name", "what do I do?"]
    assert asked_parts("what's my job & where do I live") == ["what's my job", "where do I live"]
    for one in ("Where do I live and work?", "What is 2 and 3?", "Tell me my name and what I do", "What's my name?"):
        assert asked_parts(one) == [], one
    model = _asking_for_colour()  # its ask head, replaced here by one that reads each part's kind from its words

    def asked_kinds(rows: Sequence[Sequence[int]]) -> Tensor:
        out = torch.zeros(len(rows), len(KINDS))
        for r, tokens in enumerate(rows):
            text = bytes(tokens).decode()
            out[r, next((KINDS.index(k) for k in ("name", "pet", "city") if k in text), 0)] = 1.0
        return out

    model.asked_kinds = asked_kinds  # type: ignore[method-assign]
    spans = [(" I'm Ox,", "name", 0), (" in Oslo.", "city", 0), (" a cat.", "pet", 1)]
    told = replace(IdentityState.fresh(model.config), imprint=_told(model, spans))
    question = "what name and what pet?"
    cond = model.condition_states([told], [3], [list(question.encode())])
    assert cond.recollection == ("I'm Ox\na cat",)
    prompt = list(b"sys ") + list(question.encode())
    said = generate(model, [prompt], cond, SamplingParams(max_new_tokens=60, temperature=0.0))[0]
    assert said.text == "You've told me: “I'm Ox” and “a cat”." and said.finish_reason == "stop"
    no_pet = replace(told, imprint=_told(model, [spans[0], (" Oslo, cat.", "city", 1)]))  # a label that missed the pet
    persona = "what name have you and what pet have you?"  # asks the persona: never answered with the user's words
    for state, asked in (
        (no_pet, question),
        (told, "what name and what name?"),
        (told, "what now and what then?"),
        (told, persona),
    ):
        assert model.condition_states([state], [3], [list(asked.encode())]).recollection is None, asked


def test_a_question_about_the_user_as_a_whole_is_answered_with_their_own_clauses() -> None:
    """Asked "what do you know about me?", a row whose imprint keeps labelled clauses' text replies with them quoted,
    whole, then ends, in the reply's form (lower case); a fresh identity, an imprint without text and another question
    are the model's own replies. In a batch and in a DecodeBatch each row decodes as it does alone."""
    model = with_trained_like_read()
    question = "what do you know about me?"
    rows = [list(question.encode())] * 2
    told = replace(IdentityState.fresh(model.config), imprint=_told(model, [(" I'm Ox,", "name", 0), (" and a cat.", "pet", 1)]))
    fresh = IdentityState.fresh(model.config)
    cond = model.condition_states([told, fresh], [3, 3], rows)
    assert cond.recollection == ("I'm Ox\na cat", "")
    assert model.condition_states([fresh], [3], rows[:1]).recollection is None
    assert model.condition_states([told], [3], [list(b"what is my name?")]).recollection is None
    assert told.imprint is not None
    private = replace(told, imprint=replace(told.imprint, token=torch.full_like(told.imprint.token, -1)))
    assert model.condition_states([private], [3], rows[:1]).recollection is None
    prompt = list(b"sys ") + rows[0]
    params = SamplingParams(max_new_tokens=120, temperature=0.0, reply_to=question)
    said, own = generate(model, [prompt, prompt], model.condition_states([told, fresh], [4, 4], rows), params)
    assert said.text == "You've told me: “I'm Ox” and “a cat”." and said.finish_reason == "stop"
    assert said.tokens == [*model.tokenizer.encode(said.text), model.tokenizer.end_id]
    alone = generate(model, [prompt], model.condition_states([fresh], [4], rows[:1]), params)[0]
    assert own.tokens == alone.tokens and not own.text.startswith("You've told me")
    terse = generate(model, [prompt], model.condition_states([told], [4], rows[:1]), replace(params, lowercase=True))[0]
    assert terse.text == "you've told me: “i'm ox” and “a cat”."
    batch = DecodeBatch(model)
    handles = batch.join_many([prompt, prompt], model.condition_states([told, fresh], [4, 4], rows), [params, params])
    while not all(h in batch.done for h in handles):
        batch.sample()
        batch.advance()
    assert [batch.take(h).tokens for h in handles] == [said.tokens, alone.tokens]
    recalling = Conditioning(layers=[], self_state=torch.zeros(2, 1), recollection=("", "I'm Ox"))
    assert row_params([params, params], recalling) == [params, replace(params, recollection="I'm Ox")]


@pytest.mark.parametrize("name", ["imprint_untold", "imprint_echo"])
def test_a_checkpoints_kinds_of_reply_need_the_ask_head_and_known_kinds(name: str) -> None:
    model = tiny()
    model.add_imprint(24, 4, kinds_layer=1)
    with pytest.raises(ValueError, match=f"{name} needs the ask head"):
        replace(model.config, **{name: ["colour"]})
    model.add_ask_head(2.0)
    with pytest.raises(ValueError, match=f"{name} must be"):
        replace(model.config, **{name: ["birthday"]})
    assert getattr(replace(model.config, **{name: ["pet", "colour", "pet"]}), name) == ["colour", "pet"]


def test_the_recall_temperature_caps_the_temperature_and_is_checked() -> None:
    params = SamplingParams(temperature=0.7, recall_temperature=0.2)
    assert params.recalling().temperature == 0.2 and params.recalling().recall_temperature == 0.2
    assert SamplingParams(temperature=0.1, recall_temperature=0.2).recalling().temperature == 0.1  # never raised
    assert SamplingParams(temperature=0.7).recalling().temperature == 0.7  # off
    recalls = Conditioning(layers=[], self_state=torch.zeros(2, 1), recalls=torch.tensor([True, False]))
    assert row_params([params, params], recalls) == [params.recalling(), params]
    assert row_params([params], Conditioning(layers=[], self_state=torch.zeros(1, 1))) == [params]
    for bad in (-0.1, float("nan"), True, "0"):
        with pytest.raises(ValueError, match="recall_temperature"):
            SamplingParams(recall_temperature=bad)  # type: ignore[arg-type]
    persona = SamplingParams(temperature=0.4, recall_temperature=0.0)
    assert Sampling(temperature=0.9).over(persona).recall_temperature == 0.0  # a request's temperature keeps the cap
    assert Sampling(recall_temperature=0.9).over(persona).recalling().temperature == 0.4  # a request may lift it


def test_the_command_line_passes_the_kind_tagger_layer_and_threads_and_defaults_to_the_trainer() -> None:
    checkpoint, out, config, threads = parse_args(["--out", "runs/x", "--kinds-layer", "-1", "--doing-rate", "0.2"])
    assert (checkpoint, out, threads) == (DEFAULT_CHECKPOINT, Path("runs/x"), None)
    assert not config.kinds and config.kinds_layer is None and config.doing_rate == 0.2  # -1: no kind tagger
    _, _, config, threads = parse_args(["--out", "o", "--kinds-layer", "12", "--threads", "2"])
    assert config.kinds and config.kinds_layer == 12 and threads == 2
    assert parse_args(["--out", "o"])[2] == ReadConfig()  # nothing given: the defaults
    with pytest.raises(SystemExit):
        parse_args(["--out", "o", "--gate-only"])  # --gate-only needs --resume
