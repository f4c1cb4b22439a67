"""SIA: a small transformer whose attention is bent by a persistent, per-identity state."""

from sia.attention import trace_tensor_attention, trace_tensor_attention_reference
from sia.config import ModelConfig
from sia.generate import SamplingParams, generate, stream
from sia.identity import Dynamics, IdentityState, StateFormatError, state_from_bytes, state_to_bytes
from sia.model import SIAModel
from sia.tokenizer import ByteTokenizer
from sia.turn import TurnRequest, TurnResult, run_turn, stream_turns

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
