"""SIA: a small transformer whose attention is bent by a persistent, per-identity state."""

from sia.identity.state import Dynamics, IdentityState, StateFormatError, state_from_bytes, state_to_bytes
from sia.identity.turn import TurnRequest, TurnResult, run_turn, stream_turns
from sia.model.attention import trace_tensor_attention, trace_tensor_attention_reference
from sia.model.config import ModelConfig
from sia.model.generate import SamplingParams, generate, stream
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer

__version__ = "0.1.0"

__all__ = [
    "ByteTokenizer",
    "Dynamics",
    "IdentityState",
    "ModelConfig",
    "SIAModel",
    "SamplingParams",
    "StateFormatError",
    "TurnRequest",
    "TurnResult",
    "generate",
    "run_turn",
    "state_from_bytes",
    "state_to_bytes",
    "stream",
    "stream_turns",
    "trace_tensor_attention",
    "trace_tensor_attention_reference",
]
