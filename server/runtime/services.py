"""The services over one loaded model and one store, built once: by the app's lifespan, the command line,
tests and benchmarks alike."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from server.core.config import Settings
from server.runtime.health import Health
from server.runtime.identities import Identities
from server.runtime.keys import KeyRing
from server.runtime.personas import Personas
from server.runtime.turns import TurnRunner
from server.store import Store
from sia.backbones.llama import LlamaModel
from sia.backbones.packed_linear import (
    NO_BFLOAT16_PACKING,
    bfloat16_packing_available,
    bfloat16_products_fast,
    few_rows_transposed,
)
from sia.checkpoint import load_model
from sia.model.attention import folds_query_heads
from sia.model.config import STATE_DTYPES
from sia.model.identity_model import IdentityModel
from sia.model.naming import leads, spellings
from sia.model.unsaid import unsaid_words

__all__ = ["Services", "served_model", "serving_device", "serving_dtype"]

log = logging.getLogger("sia.runtime")


def served_model(settings: Settings, model: IdentityModel | None = None, checkpoint: Path | None = None) -> IdentityModel:
    """The model the service computes with: ``model``, or the one at ``checkpoint`` (default: the settings'), on
    ``settings.device``, decoding in ``settings.dtype``, its read shifted by ``settings.read_shift`` where set (else by
    the checkpoint's own), its float32 matrices packed for faster products (a float32 or bfloat16 copy) where
    ``settings.packed_weights`` asks for it, the model is on the CPU and the build can."""
    device = serving_device(settings.device)  # before loading: a missing GPU is said at once
    loaded = model or load_model(checkpoint or settings.checkpoint, cache_dir=settings.model_cache)
    if settings.read_shift is not None:
        if not isinstance(loaded, LlamaModel):
            raise ValueError("SIA_READ_SHIFT applies to a pretrained backbone's adapter; the native model has none")
        loaded.set_read_shift(settings.read_shift)
    dtype = serving_dtype(settings.dtype, device)
    if device.type != "cpu":
        loaded.to(device)
        log.info("serving on %s (%s)", device, torch.cuda.get_device_name(device))
    if dtype != "float32":
        loaded.decode_in(STATE_DTYPES[dtype])
    elif device.type == "cpu" and settings.packed_weights != "off" and isinstance(loaded, LlamaModel) and loaded.packable:
        packing = settings.packed_weights
        if packing == "auto":
            packing = "bfloat16" if bfloat16_products_fast() and bfloat16_packing_available() else "float32"
        elif packing == "bfloat16" and not bfloat16_packing_available():
            log.warning("SIA_PACKED_WEIGHTS=bfloat16: %s; packing in float32 instead", NO_BFLOAT16_PACKING)
            packing = "float32"
        size = loaded.pack_weights(STATE_DTYPES[packing])
        log.info("packed the backbone's matrices (%s) for faster products: %.0f MB", packing, size / 2**20)
    if device.type == "cpu" and dtype == "float32" and not loaded.exact_rows:
        # float32 products of a few rows multiply in the orientation this CPU runs faster: timed here, at start-up,
        # rather than in the first turn's first step (bfloat16 copies, exact_rows, multiply every row with the copy)
        transposed = few_rows_transposed()
        log.info("few-row products as %s", "(W x^T)^T" if transposed else "x W^T")
    if device.type == "cpu" and dtype == "float32":
        # so is the way a float32 decoding step calls the attention kernel (its activations are float32 whatever
        # copies the matrices have)
        folded = folds_query_heads(torch.float32)
        log.info("decoding steps' attention with query heads %s", "folded" if folded else "grouped")
    unsaid_words(loaded.tokenizer)  # the tokens a persona's reply never writes: read from the vocabulary once, here
    spellings(loaded.tokenizer), leads(loaded.tokenizer)  # and how it spells the starts of the user's words
    return loaded


def serving_dtype(setting: str, device: torch.device) -> str:
    """The dtype ``SIA_DTYPE`` names on ``device``: auto is bfloat16 on a GPU, float32 on the CPU."""
    if setting != "auto":
        return setting
    return "float32" if device.type == "cpu" else "bfloat16"


def serving_device(setting: str) -> torch.device:
    """The device ``SIA_DEVICE`` names: cpu, cuda[:N] (which must be present: ValueError otherwise), or auto (the
    first GPU torch sees, else the CPU)."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"SIA_DEVICE={setting}: torch sees no CUDA GPU here (a CPU-only build or no driver); use cpu or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"SIA_DEVICE={setting}: torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    elif device.type != "cpu":
        raise ValueError(f"SIA_DEVICE={setting}: the service computes on cpu or cuda")
    return device


@dataclass(frozen=True)
class Services:
    store: Store
    personas: Personas
    identities: Identities
    turns: TurnRunner
    keys: KeyRing
    health: Health

    @classmethod
    def over(cls, model: IdentityModel, store: Store) -> Services:
        """Every service over ``model`` (which must keep identity state) and ``store``."""
        personas = Personas(model, store)
        identities = Identities(model.config, store, personas, model.tokenizer)
        settings = store.settings
        turns = TurnRunner(
            model,
            store,
            personas,
            identities,
            store_text=settings.store_turn_text,
            window_tokens=settings.prompt_window_tokens,
        )
        return cls(store, personas, identities, turns, KeyRing(store), Health(model, store))

    def close(self) -> None:
        self.store.close()
