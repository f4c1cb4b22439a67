"""The shipped adapter's recipe (recipes/smollm2.json) runs end to end: every stage trains from the export of the
one before and is exported as the recipe says; a finished recipe run again trains nothing; bad recipes are refused.
recipes/any-base.json gives a bare base an imprint, its copy read and the two small heads, starting from nothing trained."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from sia.backbones.injected_attention import CLOSED_GATE
from sia.backbones.llama import LlamaModel
from sia.backbones.weights import cache_entry, file_sha256
from sia.checkpoint import load_model, source_digest
from sia.commands import main
from sia.identity.state import IdentityState
from sia.learn.adapter import recipe as recipe_module
from sia.learn.adapter import train as adapter_train
from sia.learn.adapter.recipe import Recipe, run_recipe
from sia.learn.imprint_read import NEW_TOKENS, imprint_of, message_tokens

from .conftest import TinyVocab, write_tiny_gguf

SHIPPED = Path(__file__).resolve().parents[2] / "recipes" / "smollm2.json"
ANY_BASE = SHIPPED.with_name("any-base.json")
# a tiny backbone and two steps per stage: the chain, not the figures
TINY = {
    "model": {"d_self": 8, "memory_tokens": 2, "trace_layers": [1], "block_size": 2048},
    "steps": 2,
    "batch_size": 2,
    "write_stage_batch": 2,
    "curriculum": [[0, 1]],
    "eval_every": 1000,
    "eval_episodes": 2,
    "eval_between": 1,
    "checkpoint_every": 1000,
    "threads": 1,
    "precision": "fp32",
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_vocab: TinyVocab) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("recipe") / "tiny.gguf", tiny_vocab).path


# the shipped settings' copy heads are SmolLM2's (layers 21 to 28): the tiny backbone's two layers name their own
TINY_HEADS = [[1, 0], [1, 3]]


def _tiny(base: Path) -> Recipe:
    return Recipe.from_file(SHIPPED).with_overrides(
        {**TINY, "base": str(base)}, {"slot_rank": 2}, {"imprint_copy_heads": TINY_HEADS}
    )


def test_the_shipped_recipe_trains_and_exports_every_stage_in_order(base: Path, tmp_path: Path) -> None:
    shipped = Recipe.from_file(SHIPPED)
    recipe = _tiny(base)
    out = tmp_path / "run"
    final = run_recipe(recipe, out, progress=False, cache_dir=base.parent / "models")
    assert final == out / "final"
    names = [stage.name for stage in shipped.stages if stage.imprint is None]
    assert len(names) == 4 and [s.name for s in shipped.stages] == [
        *names,
        "imprint",
        "imprint-gate",
        "imprint-ask",
        "imprint-natural",
    ]
    exports = [out / f"{i + 1}-{name}" / "export" for i, name in enumerate(names)]
    for i, name in enumerate(names):
        ran = json.loads((out / f"{i + 1}-{name}" / "train.json").read_text())
        # what the stage trained with: the recipe's own settings (only the tiny backbone and the step count replaced)
        for key, value in shipped.stages[i].train.items():
            if key not in TINY:
                assert ran[key] == value, (name, key)
        assert ran["init"] == (None if i == 0 else str(exports[i - 1]))  # each stage starts from the one before
        assert ran["steps"] == 2 and ran["base"] == str(base)
        exported = json.loads((exports[i] / "config.json").read_text())
        assert exported["slot_rank"] == 2 and exported["weights_dtype"] == shipped.stages[i].export.dtype == "float16"
        assert exported["read_shift"] == (shipped.stages[i].export.read_shift or 0.0)
        assert {t.dtype for t in load_file(str(exports[i] / "identity.safetensors")).values()} == {torch.float16}
        assert not (exports[i].parent / (exports[i].name + ".partial")).exists()
    assert [s.export.read_shift for s in shipped.stages] == [None, None, 0.5, 0.5, None, None, None, None]
    last = load_model(exports[3], cache_dir=base.parent / "models")
    assert isinstance(last, LlamaModel) and last.config.read_shift == 0.5 and last.config.slot_rank == 2
    before = load_model(exports[2], cache_dir=base.parent / "models")
    assert isinstance(before, LlamaModel)
    moved = [n for n, t in last.identity_state_dict().items() if not torch.equal(t, before.identity_state_dict()[n])]
    assert moved  # the fourth stage trained over the export it started from
    # the imprint stage: the fourth's export with an imprint, a read adapter and a kind tagger, its shifts as stated
    stated = shipped.stages[4].imprint
    assert stated is not None
    model = load_model(out / "5-imprint" / "export", cache_dir=base.parent / "models")
    assert isinstance(model, LlamaModel) and model.config.imprint_tokens == stated["tokens"]
    assert model.config.read_shift == stated["read_shift"] and model.config.imprint_shift == stated["imprint_shift"]
    assert not model.config.imprint_gate
    for name, tensor in last.identity_state_dict().items():
        assert torch.equal(model.identity_state_dict()[name], tensor), name  # the adapter before it is kept as it was
    # the gate stage: the imprint stage's export with the imprint's read gate trained, everything else as it was
    gated = load_model(out / "6-imprint-gate" / "export", cache_dir=base.parent / "models")
    assert isinstance(gated, LlamaModel) and gated.config.imprint_gate
    kept = model.identity_state_dict()
    trained = gated.identity_state_dict()
    assert set(trained) - set(kept) and all("imprint_gate" in n for n in set(trained) - set(kept))
    for name, tensor in kept.items():
        assert torch.equal(trained[name], tensor), name
    assert any(bool(trained[n].abs().sum() > 0) for n in set(trained) - set(kept))  # the gate moved from zero
    # the ask stage: the gate stage's export with an ask head trained, its bias as stated, everything else as it was
    asking = load_model(out / "7-imprint-ask" / "export", cache_dir=base.parent / "models")
    stated = shipped.stages[6].imprint
    assert stated is not None and isinstance(asking, LlamaModel)
    assert asking.config.imprint_ask_bias == stated["ask_bias"] > 0 and asking.imprint_ask is not None
    assert asking.config.imprint_label_min == stated["label_min"] < gated.config.imprint_label_min == 0.5
    asked = asking.identity_state_dict()
    assert sorted(set(asked) - set(trained)) == ["imprint_ask.bias", "imprint_ask.weight"]
    for name, tensor in trained.items():
        assert torch.equal(asked[name], tensor), name
    assert bool(asked["imprint_ask.weight"].abs().sum() > 0)  # trained, not the untrained head
    # the natural stage: the ask stage's export with its kind tagger and ask head fitted afresh, the hand-written
    # training part beside the generated messages; the imprint, the read and its gate as they were
    natural = load_model(final, cache_dir=base.parent / "models")
    stated = shipped.stages[7].imprint
    assert stated is not None and isinstance(natural, LlamaModel)
    assert stated["kinds_only"] and stated["kinds_natural"] > 0 and stated["asks_natural"]
    assert natural.config.imprint_label_min == stated["label_min"] and natural.config.imprint_ask_bias == stated["ask_bias"]
    refit = natural.identity_state_dict()
    assert set(refit) == set(asked)
    changed = sorted(n for n, t in asked.items() if not torch.equal(refit[n], t))
    assert changed == ["imprint_ask.bias", "imprint_ask.weight", "imprint_kind.bias", "imprint_kind.weight"]
    history = json.loads((final / "read_history.json").read_text())
    assert (
        history["kinds"]["tokens"]
        > json.loads((out / "5-imprint" / "export" / "read_history.json").read_text())["kinds"]["tokens"]
    )
    # how the final checkpoint reads, which no stage trains: the recipe's settings, written after the last stage
    for key, value in shipped.settings.items():
        assert getattr(natural.config, key) == (TINY_HEADS if key == "imprint_copy_heads" else value), key
    assert natural.config.imprint_copy_layers == [1]  # the copy layers follow the heads named
    assert json.loads((out / "recipe.json").read_text()) == recipe.to_dict()


def test_the_shipped_recipe_states_how_the_bundled_checkpoint_reads() -> None:
    """What no stage trains is the recipe's settings: they are the bundled checkpoint's own."""
    shipped = Recipe.from_file(SHIPPED)
    bundled = json.loads((SHIPPED.parents[1] / "sia" / "checkpoints" / "smollm2" / "config.json").read_text())
    assert {"imprint_copy", "imprint_copy_heads", "imprint_untold", "imprint_aside_weight"} <= set(shipped.settings)
    for key, value in shipped.settings.items():
        assert bundled[key] == value, key
    # and what the stages write: the read shift, label threshold and ask bias of the last stages
    assert bundled["read_shift"] == shipped.stages[4].imprint["read_shift"]  # type: ignore[index]
    assert bundled["imprint_label_min"] == shipped.stages[7].imprint["label_min"]  # type: ignore[index]
    assert bundled["imprint_ask_bias"] == shipped.stages[7].imprint["ask_bias"]  # type: ignore[index]


def test_settings_that_do_not_fit_the_final_checkpoint_leave_it_as_it_was(base: Path, tmp_path: Path) -> None:
    recipe = _tiny(base)
    one = Recipe(recipe.train, recipe.stages[:1], recipe.description, {"imprint_copy": 1.0})
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"do not fit .*its stages are kept.*imprint_copy needs an imprint"):
        run_recipe(one, out, progress=False, cache_dir=base.parent / "models")
    written = json.loads((out / "final" / "config.json").read_text())
    assert written["imprint_copy"] == 0.0 and written["slot_rank"] == 2  # the stage's export, untouched
    fitting = Recipe(recipe.train, recipe.stages[:1], recipe.description, {"read_shift": 3.0})
    assert run_recipe(fitting, out, progress=False, cache_dir=base.parent / "models") == out / "final"
    assert json.loads((out / "final" / "config.json").read_text())["read_shift"] == 3.0  # set with nothing trained again


def test_a_finished_recipe_run_again_trains_nothing(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = _tiny(base)
    one = Recipe(recipe.train, recipe.stages[:2], recipe.description)
    out = tmp_path / "run"
    calls: list[str] = []
    trainer = adapter_train.train

    def counting(config: Any, **kwargs: Any) -> Path:
        calls.append(config.out_dir)
        return trainer(config, **kwargs)

    monkeypatch.setattr(recipe_module, "train", counting)
    (out / "1-write-read").mkdir(parents=True)
    (out / "final.partial").mkdir()  # an export stopped half-way is redone
    final = run_recipe(one, out, progress=False, cache_dir=base.parent / "models")
    assert len(calls) == 2 and final == out / "final"
    assert run_recipe(one, out, progress=False, cache_dir=base.parent / "models") == final
    assert len(calls) == 2  # both stages were exported: nothing trained again


def test_sia_recipe_runs_a_recipe_file_from_the_command_line(base: Path, tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    shipped = json.loads(SHIPPED.read_text())
    shipped["stages"] = shipped["stages"][:1]
    shipped["stages"][0]["export"]["slot_rank"] = 2
    shipped["train"].update({k: v for k, v in TINY.items() if k not in ("model", "steps")})
    shipped["train"]["model"].update(TINY["model"])
    shipped["settings"] = {"read_shift": 1.5}  # the first stage's export has no imprint for the shipped ones
    path.write_text(json.dumps(shipped))
    out = tmp_path / "run"
    cache = base.parent / "models"
    argv = ["recipe", str(path), "--out", str(out), "--steps", "1", "--base", str(base), "--cache", str(cache), "--quiet"]
    assert main(argv) == 0
    assert json.loads((out / "1-write-read" / "train.json").read_text())["steps"] == 1
    final = json.loads((out / "final" / "config.json").read_text())
    assert final["slot_rank"] == 2 and final["read_shift"] == 1.5


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda r: r["stages"][0]["train"].update(out_dir="elsewhere"), "sets \\['out_dir'\\]"),
        (lambda r: r["train"].update(init="runs/x"), "sets \\['init'\\]"),
        (lambda r: r["stages"][1].update(name="write-read"), "stage names must differ"),
        (lambda r: r["stages"][1].update(name="Right After"), "lower-case"),
        (lambda r: r["stages"][2]["train"].update(lr=-1.0), "min_lr <= lr"),
        (lambda r: r["stages"][2]["train"].update(learning_rate=0.1), "unknown stage closed-kinds's training keys"),
        (lambda r: r["stages"][0]["export"].update(rank=4), "unknown export keys"),
        (lambda r: r["stages"][0].update(steps=4), "unknown stage keys"),
        (lambda r: r.update(stages=[]), "at least one stage"),
        (lambda r: r.update(seed=3), "unknown recipe keys"),
        (lambda r: r["settings"].update(d_self=8), "unknown settings \\['d_self'\\]"),
        (lambda r: r.update(settings=[1]), "settings must be a JSON object"),
    ],
)
def test_a_bad_recipe_is_refused_naming_the_file(tmp_path: Path, change: Any, match: str) -> None:
    data = json.loads(SHIPPED.read_text())
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match) as raised:
        Recipe.from_file(path)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize("path", sorted(SHIPPED.parent.glob("*.json")), ids=lambda p: p.name)
def test_every_recipe_builds_each_stage_as_it_states_it(path: Path) -> None:
    """Each recipe in recipes/ loads, and every stage's config holds what the recipe and the stage state."""
    recipe = Recipe.from_file(path)
    for index, stage in enumerate(recipe.stages):
        if stage.imprint is not None:
            continue  # an imprint stage has no training config of its own (test_an_imprint_stage_...)
        config = asdict(recipe.config(index, Path("runs/r")))
        stated = {**recipe.train, **stage.train}
        for key, value in stated.items():
            if key == "model":
                assert {**config["model"], **recipe.train.get("model", {}), **stage.train.get("model", {})} == config["model"]
            else:
                assert config[key] == value, (path.name, stage.name, key)


def test_an_imprint_stage_gives_the_export_before_it_an_imprint_and_a_trained_read(base: Path, tmp_path: Path) -> None:
    shipped = _tiny(base)
    imprint: dict[str, Any] = {"name": "imprint", "imprint": {"steps": 2, "batch": 2, "rank": 2, "tokens": 8, "distractors": 1}}
    # no ask head here, which the shipped settings' untold reply needs
    data = {**shipped.to_dict(), "stages": [shipped.to_dict()["stages"][0], imprint], "settings": {"imprint_copy": 2.0}}
    recipe = Recipe.from_dict(data).with_overrides({"steps": 1, "seed": 3})
    assert recipe.stages[1].imprint == {**imprint["imprint"], "steps": 1, "seed": 3}
    final = run_recipe(recipe, tmp_path / "run", progress=False, cache_dir=base.parent / "models")
    config = json.loads((final / "config.json").read_text())
    assert config["imprint_tokens"] == 8 and config["imprint_read_rank"] == 2 and config["imprint_copy"] == 2.0
    assert config["imprint_kinds_layer"] == config["n_layer"] // 2
    history = json.loads((final / "read_history.json").read_text())
    assert len(history["history"]) == 1 and history["kinds"]["tokens"] > 0
    model = load_model(final, cache_dir=base.parent / "models")
    assert isinstance(model, LlamaModel) and model.imprint_kind is not None
    names = set(model.identity_state_dict())
    assert any("imprint_read" in n for n in names) and any("imprint_kind" in n for n in names)


def test_the_any_base_recipe_gives_a_bare_base_an_imprint_its_copy_read_and_two_heads_with_no_read_trained(
    base: Path, tmp_path: Path
) -> None:
    stated = Recipe.from_file(ANY_BASE)
    assert [s.name for s in stated.stages] == ["imprint"] and stated.train.get("base") is None  # the bundled base unless told
    cache = base.parent / "models"
    bare = load_model(base, cache_dir=cache)
    hf_dir = cache_entry(cache, file_sha256(base))  # the GGUF dequantised: a Hugging Face directory, the other kind of base
    recipe = stated.with_overrides({"base": str(hf_dir), "model": {"block_size": 2048}})
    final = run_recipe(recipe, tmp_path / "run", progress=False, cache_dir=cache)
    assert json.loads((final / "base.json").read_text()) == {"path": str(hf_dir), "sha256": source_digest(hf_dir)}
    model = load_model(final, cache_dir=cache)
    assert isinstance(model, LlamaModel) and isinstance(bare, LlamaModel)
    c, stage = model.config, stated.stages[0].imprint
    assert stage is not None and c.imprint_read_rank == 0 and not c.imprint_gate and c.imprint_tokens == NEW_TOKENS
    assert c.imprint_copy == stage["copy"] == 4.0 and c.imprint_copy_heads is None  # every query head of the last third
    assert c.imprint_copy_layers == [c.n_layer - 1] and c.imprint_kinds_layer == c.n_layer // 2
    assert c.imprint_ask_bias == stage["ask_bias"] and c.imprint_label_min == stage["label_min"]
    identity = model.identity_state_dict()
    assert not any("imprint_read" in n for n in identity)  # nothing trained reads the entries but the two small heads
    assert all(bool((t == CLOSED_GATE).all()) for n, t in identity.items() if n.endswith("slot_bias"))
    assert all(bool(identity[n].abs().sum() > 0) for n in ("imprint_kind.weight", "imprint_ask.weight"))
    history = json.loads((final / "read_history.json").read_text())
    assert history["history"] == [] and history["kinds"]["tokens"] > 0 and history["asks"]
    # a fresh identity is the bare base exactly; the user's words, imprinted, change what it says
    system = model.tokenizer.system_prompt("You are a helpful assistant.")
    idx = torch.tensor([model.tokenizer.turn_prompt("What is my name?", system)[0]])
    asked = [message_tokens(model.tokenizer, "What is my name?")]
    fresh = IdentityState.fresh(c)
    told = replace(fresh, imprint=imprint_of(model, system, ["My name is Zorblax and I live in Quarzazate."]))
    assert told.imprint is not None and told.imprint.used > 0
    with torch.no_grad():
        plain = bare(idx, bare.condition_states([IdentityState.fresh(bare.config)], [len(system)])).logits
        unchanged = model(idx, model.condition_states([fresh], [len(system)], asked)).logits
        recalled = model(idx, model.condition_states([told], [len(system)], asked)).logits
    torch.testing.assert_close(unchanged, plain, atol=1e-5, rtol=0)
    assert (recalled - plain).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("stages", "match"),
    [
        ([0, {"name": "imprint", "imprint": {"steps": 2}, "train": {"steps": 3}}], "no train or export"),
        ([0, {"name": "imprint", "imprint": {"rank_of": 2}}], "unknown imprint stage keys"),
        ([{"name": "imprint", "imprint": {"resume": True}}], "untrained backbone: it has no imprint to resume"),
        ([{"name": "imprint", "imprint": {"kinds_only": True}}], "untrained backbone"),
        ([{"name": "imprint", "imprint": {"rank": 0, "gate": True}}], "rank 0 has none"),
        ([{"name": "imprint", "imprint": {"rank": -1}}], "rank is the read adapter's rank"),
        ([{"name": "imprint", "imprint": {"copy": -1.0}}], "copy read's lambda"),
        ([{"name": "imprint", "imprint": {"copy": float("nan")}}], "copy read's lambda"),
    ],
)
def test_a_bad_imprint_stage_is_refused(stages: list[Any], match: str) -> None:
    data = json.loads(SHIPPED.read_text())
    data["stages"] = [data["stages"][0] if stage == 0 else stage for stage in stages]
    with pytest.raises(ValueError, match=match):
        Recipe.from_dict(data)
