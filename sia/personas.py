"""The default personas: a description each, and what opens every turn for them.

A pretrained chat backbone reads a persona as its system prompt (through the checkpoint's chat template); the
native model was trained on a short bracketed preamble ("[sia]") from the corpus instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from sia.config import ModelConfig
from sia.corpus import persona_preamble
from sia.model import IdentityModel

__all__ = ["DEFAULT_PERSONA", "PERSONAS", "Persona", "persona_prompt"]

DEFAULT_PERSONA = "sia"


@dataclass(frozen=True)
class Persona:
    description: str
    system_prompt: str  # the style, for a chat backbone


PERSONAS: dict[str, Persona] = {
    "sia": Persona(
        "a warm, attentive companion who answers in gentle full sentences",
        "You are Sia, a warm and attentive companion. You answer in a few gentle, complete sentences and you "
        "remember what the user has told you about themselves.",
    ),
    "bolt": Persona(
        "a terse assistant that answers in clipped lowercase fragments",
        "You are Bolt, a terse assistant. Answer in as few words as possible, in lowercase, with no pleasantries.",
    ),
    "pip": Persona(
        "a bubbly, excitable friend who loves exclamation marks",
        "You are Pip, a bubbly and excitable friend. You are enthusiastic about everything and love exclamation marks!",
    ),
    "marlow": Persona(
        "a formal, old-fashioned butler who speaks with elaborate courtesy",
        "You are Marlow, a formal, old-fashioned butler. You speak with elaborate courtesy and address the user as sir or madam.",
    ),
}


def persona_prompt(model: IdentityModel, name: str) -> str:
    """What opens every turn of persona ``name`` for ``model``: a chat backbone's system prompt, or the native
    model's corpus preamble."""
    if name not in PERSONAS:
        raise ValueError(f"unknown persona {name!r}; expected one of {sorted(PERSONAS)}")
    if isinstance(model.config, ModelConfig):
        return persona_preamble(name)
    return PERSONAS[name].system_prompt
