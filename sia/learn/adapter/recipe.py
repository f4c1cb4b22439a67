"""A recipe: the stages that train and export an adapter, in order, each stage starting from the one before.

A recipe file (``recipes/smollm2.json`` is the shipped adapter's) holds

* ``train``: the training settings every stage shares (``TrainConfig`` fields: the backbone, the model section, ...);
* ``stages``: ``[{"name", "train": {what this stage changes}, "export": {"slot_rank", "dtype", "read_shift"}}, ...]``;
  a stage ``{"name", "imprint": {ReadConfig fields}}`` instead gives the export before it an imprint, a read adapter
  and a kind tagger trained by ``sia.learn.imprint_read`` (its checkpoint is written as it is; no export step). As the
  first stage, it starts from the recipe's backbone (``train``'s ``base`` and ``model``) with untrained identity
  parameters, the self slots' read shut (``recipes/any-base.json``: an imprint for any LLaMA-family base, no GPU);
* ``settings`` (optional): how the final checkpoint reads, which no stage trains (``SETTINGS``: the copy read's λ and
  heads, the untold reply's kinds, the echo opening's kinds, the asides' weight, ...), written into ``OUT/final``'s
  config after the last stage.

Stage k trains in ``OUT/<k>-<name>/`` (``sia.learn.adapter.train``, which resumes where a run stopped), starting from
stage k-1's export (its ``init``); its export (``sia.checkpoint.export_adapter``) is written to
``OUT/<k>-<name>/export``, the last stage's to ``OUT/final``: the checkpoint to ship. A stage whose export exists is
done and skipped, so running a recipe again carries on where it stopped. ``out_dir`` and ``init`` belong to the
recipe, never to a stage.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sia.backbones.llama import UNTRAINED_SLOT_BIAS
from sia.checkpoint import CONFIG_FILE, DEFAULT_CACHE, export_adapter, save_llama_checkpoint
from sia.learn.adapter.train import TrainConfig, train
from sia.learn.adapter.trainable import build_model
from sia.learn.imprint_read import ReadConfig, train_checkpoint
from sia.model.config import LlamaConfig, check_fields, read_json_object

log = logging.getLogger(__name__)

FINAL = "final"  # OUT/final: the last stage's export
EXPORT = "export"
RECIPE_FILE = "recipe.json"  # the recipe as run (overrides applied), written into OUT
_RUN_KEYS = ("out_dir", "init")  # set by the recipe for each stage
# overrides of every stage's training that an imprint stage takes too, by their ReadConfig names
_READ_SHARED = {"steps": "steps", "seed": "seed", "batch_size": "batch"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# the LlamaConfig fields a recipe's ``settings`` may set on its final checkpoint: how it reads, not what it learned
SETTINGS = (
    "read_shift",
    "imprint_shift",
    "imprint_label_min",
    "imprint_ask_bias",
    "imprint_aside_weight",
    "imprint_mend_bonus",
    "imprint_untold",
    "imprint_untold_by_label",
    "imprint_echo",
    "imprint_copy",
    "imprint_copy_layers",
    "imprint_copy_heads",
    "metric_rank",
)


@dataclass(frozen=True)
class Export:
    """How a stage's trained checkpoint is rewritten (``sia export``): None keeps what training wrote."""

    slot_rank: int | None = None  # each layer's slot maps factored to this rank
    dtype: str | None = None  # storage dtype of the identity weights
    read_shift: float | None = None  # the read's strength stored in the checkpoint


@dataclass(frozen=True)
class Stage:
    name: str
    train: dict[str, Any]  # the training fields this stage sets over the recipe's shared ones
    export: Export
    imprint: dict[str, Any] | None = None  # an imprint stage: the ReadConfig fields it sets (then train is empty)


def _merged(shared: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """``own`` over ``shared``; the model section merged key by key (a stage names only the model fields it changes)."""
    data = {**shared, **own}
    if "model" in shared or "model" in own:
        data["model"] = {**shared.get("model", {}), **own.get("model", {})}
    return data


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object; got {value!r}")
    return value


@dataclass(frozen=True)
class Recipe:
    train: dict[str, Any]
    stages: tuple[Stage, ...]
    description: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # SETTINGS written into OUT/final's config

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a recipe needs at least one stage")
        unknown = sorted(set(self.settings) - set(SETTINGS))
        if unknown:
            raise ValueError(f"unknown settings {unknown}; a recipe's settings are {sorted(SETTINGS)}")
        names = [stage.name for stage in self.stages]
        for name in names:
            if not isinstance(name, str) or not _NAME.match(name):
                raise ValueError(f"a stage's name is lower-case letters, digits and '-'; got {name!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must differ; got {names}")
        for where, data in [("the recipe's train", self.train)] + [(f"stage {s.name}'s train", s.train) for s in self.stages]:
            taken = sorted(set(data) & set(_RUN_KEYS))
            if taken:
                raise ValueError(f"{where} sets {taken}: the recipe sets each stage's out_dir and init")
        for index, stage in enumerate(self.stages):
            if stage.imprint is None or index == 0:
                self.config(index, Path("."))  # every training stage, and the backbone a first stage starts from, is valid
            if stage.imprint is None:
                continue
            if stage.train or stage.export != Export():
                raise ValueError(f"stage {stage.name} trains the imprint over the stage before: no train or export of its own")
            read = read_config(stage.imprint)
            if index == 0 and (read.resume or read.kinds_only):
                raise ValueError(f"stage {stage.name} starts from an untrained backbone: it has no imprint to resume or keep")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        check_fields(cls, dict(data), "recipe")
        stages = []
        for i, raw in enumerate(data.get("stages", [])):
            raw = _object(raw, f"stage {i}")
            unknown = sorted(set(raw) - {"name", "train", "export", "imprint"})
            if unknown:
                raise ValueError(f"unknown stage keys {unknown}; known keys are ['export', 'imprint', 'name', 'train']")
            export = _object(raw.get("export", {}), f"stage {i}'s export")
            check_fields(Export, export, "export")
            imprint = None if raw.get("imprint") is None else _object(raw["imprint"], f"stage {i}'s imprint")
            train = _object(raw.get("train", {}), f"stage {i}'s train")
            stages.append(Stage(raw.get("name", ""), train, Export(**export), imprint))
        train, settings = _object(data.get("train", {}), "the recipe's train"), _object(data.get("settings", {}), "settings")
        return cls(train, tuple(stages), str(data.get("description", "")), settings)

    @classmethod
    def from_file(cls, path: str | Path) -> Recipe:
        try:
            return cls.from_dict(read_json_object(path))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        stages = [
            {"name": s.name, "train": s.train, "export": asdict(s.export)}
            if s.imprint is None
            else {"name": s.name, "imprint": s.imprint}
            for s in self.stages
        ]
        return {"description": self.description, "train": self.train, "stages": stages, "settings": self.settings}

    def with_overrides(
        self,
        train: Mapping[str, Any] | None = None,
        export: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Recipe:
        """Every stage with ``train`` over its own settings and ``export`` over its export (e.g. a smoke run's tiny
        backbone and few steps, or a GPU's device and batch sizes), and ``settings`` over the final checkpoint's."""
        unknown = sorted(set(export or {}) - {f.name for f in fields(Export)})
        if unknown:
            raise ValueError(f"unknown export keys {unknown}")
        stages = tuple(
            Stage(s.name, _merged(s.train, train or {}), Export(**{**asdict(s.export), **(export or {})}))
            if s.imprint is None
            else Stage(
                s.name, {}, Export(), {**s.imprint, **{_READ_SHARED[k]: v for k, v in (train or {}).items() if k in _READ_SHARED}}
            )
            for s in self.stages
        )
        return Recipe(_merged(self.train, train or {}), stages, self.description, {**self.settings, **(settings or {})})

    def stage_dir(self, out: Path, index: int) -> Path:
        return out / f"{index + 1}-{self.stages[index].name}"

    def export_dir(self, out: Path, index: int) -> Path:
        return out / FINAL if index == len(self.stages) - 1 else self.stage_dir(out, index) / EXPORT

    def config(self, index: int, out: Path) -> TrainConfig:
        """Stage ``index``'s training config: the shared settings, the stage's over them, its directory and init."""
        data = _merged(self.train, self.stages[index].train)
        data["out_dir"] = str(self.stage_dir(out, index))
        data["init"] = None if index == 0 else str(self.export_dir(out, index - 1))
        check_fields(TrainConfig, data, f"stage {self.stages[index].name}'s training")
        return TrainConfig(**data)


def read_config(fields_: Mapping[str, Any]) -> ReadConfig:
    """An imprint stage's ReadConfig: its fields over the defaults; unknown ones refused."""
    check_fields(ReadConfig, dict(fields_), "imprint stage")
    return ReadConfig(**fields_)


def untrained(recipe: Recipe, out: Path, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The recipe's backbone with untrained identity parameters, the self slots' read shut (nothing trained reads the
    self state), as a SIA checkpoint in ``OUT/1-<name>/untrained``: where a first stage that is an imprint stage starts."""
    # the slots' bias at the closed gate, not the open one training starts from
    model, ref = build_model(replace(recipe.config(0, out), slot_bias=UNTRAINED_SLOT_BIAS), cache_dir)
    return save_llama_checkpoint(model, recipe.stage_dir(out, 0) / "untrained", ref)


def run_recipe(recipe: Recipe, out: Path, *, progress: bool = True, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """Train and export every stage in order (stages already exported are skipped); returns ``OUT/final``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / RECIPE_FILE).write_text(json.dumps(recipe.to_dict(), indent=2) + "\n")
    for index, stage in enumerate(recipe.stages):
        done = recipe.export_dir(out, index)
        if done.is_dir():
            log.info("stage %d/%d %s: exported already (%s)", index + 1, len(recipe.stages), stage.name, done)
            continue
        log.info("stage %d/%d %s", index + 1, len(recipe.stages), stage.name)
        partial = done.with_name(done.name + ".partial")  # renamed once whole: a stopped export is redone
        shutil.rmtree(partial, ignore_errors=True)
        if stage.imprint is not None:
            before = untrained(recipe, out, cache_dir) if index == 0 else recipe.export_dir(out, index - 1)
            train_checkpoint(before, partial, read_config(stage.imprint), cache_dir=cache_dir)
            partial.rename(done)
            continue
        trained = train(recipe.config(index, out), progress=progress, cache_dir=cache_dir)
        how = stage.export
        export_adapter(
            trained / "last", partial, slot_rank=how.slot_rank, dtype=how.dtype, read_shift=how.read_shift, cache_dir=cache_dir
        )
        partial.rename(done)
    final = recipe.export_dir(out, len(recipe.stages) - 1)
    if recipe.settings:
        settle(final, recipe.settings)
    return final


def settle(checkpoint: Path, settings: Mapping[str, Any]) -> None:
    """Write ``settings`` (``SETTINGS`` fields) into a SIA checkpoint's config, validated as the config validates them
    (ValueError, the checkpoint left as it was)."""
    path = checkpoint / CONFIG_FILE
    config = LlamaConfig.from_file(path)
    if "imprint_copy_heads" in settings:  # the copy layers follow the heads named, unless named too
        settings = {"imprint_copy_layers": None, **settings}
    try:
        config = replace(config, **settings)
    except (TypeError, ValueError) as exc:
        kept = "its stages are kept: change them and run again"
        raise ValueError(f"the recipe's settings do not fit {checkpoint} ({kept}): {exc}") from exc
    config.to_file(path)
