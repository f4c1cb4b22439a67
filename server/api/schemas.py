"""Request and response bodies of the public API (chat and the OpenAI-compatible routes).

These are the wire format; the tables (server/db/tables.py) and the runtime's records are separate.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from sia.model.generate import MAX_ADDRESS, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, Sampling, SamplingParams, logit_bias_pairs

RepetitionPenalty = Annotated[
    float | None,
    Field(
        None,
        ge=1,
        allow_inf_nan=False,
        description="divides positive / multiplies negative logits of tokens the reply already holds; 1 is off (persona default)",
    ),
]
NoRepeatNgram = Annotated[
    int | None,
    Field(
        None, ge=0, le=2**31 - 1, description="bans a token that would repeat an n-gram of the reply; 0 is off (persona default)"
    ),
]
FrequencyPenalty = Annotated[
    float | None,
    Field(
        None,
        ge=-2,
        le=2,
        description="subtracted from a token's logit once per time the reply holds it; 0 is off (persona default)",
    ),
]
PresencePenalty = Annotated[
    float | None,
    Field(None, ge=-2, le=2, description="subtracted from the logit of every token the reply holds; 0 is off (persona default)"),
]
LogitBiasOnce = Annotated[
    bool | None,
    Field(None, description="each logit_bias holds only until the reply holds its token (persona default)"),
]
Lowercase = Annotated[bool | None, Field(None, description="the reply written in lower case (persona default)")]
MaxSentences = Annotated[
    int | None,
    Field(None, ge=0, le=2**31 - 1, description="the reply ends after this many sentences; 0 is off (persona default)"),
]
MaxWords = Annotated[
    int | None,
    Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="the reply's end is pulled nearer at every word past this many, so it ends soon after; 0 is off"
        " (persona default)",
    ),
]
WindDown = Annotated[
    int | None,
    Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="the reply's end is pulled nearer at every token of its last this many before max_tokens, so a"
        " reply the limit would cut ends at a sentence's end first; 0 is off (persona default)",
    ),
]
Exclaim = Annotated[
    bool | None,
    Field(None, description='a full stop right after a word is written "!" until the reply holds one (persona default)'),
]


def checked_address(value: str) -> str:
    """A form of address as the sampler checks it: printable, at most 40 characters, holding a word ("" is off)."""
    SamplingParams(address=value)
    return value


AddressText = Annotated[str, Field(max_length=MAX_ADDRESS), AfterValidator(checked_address)]
Address = Annotated[
    AddressText | None,
    Field(
        None,
        description='a form of address (e.g. ", sir") written before the reply\'s first sentence end after a word, unless '
        'the reply already says it; "" is off (persona default)',
    ),
]
RecallTemperature = Annotated[
    float | None,
    Field(
        None,
        ge=0,
        le=5,
        description="a reply to a question about the user's facts, with an imprint to answer from, is decoded at no more "
        "than this temperature (persona default; at or above temperature: no cap)",
    ),
]
UserId = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$", description="the user's id")]


def checked_logit_bias(value: dict[str, float]) -> dict[str, float]:
    """OpenAI's logit_bias as the sampler checks it: keys token ids written as decimal integers, values in [-100, 100],
    at most MAX_LOGIT_BIAS of them (whether an id is in the model's vocabulary is checked with the persona's decoding,
    before the identity is held)."""
    SamplingParams(logit_bias=logit_bias_pairs(value))
    return value


LogitBiasMap = Annotated[dict[str, float], Field(max_length=MAX_LOGIT_BIAS), AfterValidator(checked_logit_bias)]
LogitBias = Annotated[
    LogitBiasMap | None,
    Field(
        None, description='token id -> bias in [-100, 100] added to its logit at every step, e.g. {"38061": 2} (persona default)'
    ),
]


def requested_bias(value: dict[str, float] | None) -> tuple[tuple[int, float], ...] | None:
    """A request's logit_bias for Sampling: None where the request leaves it to the persona."""
    return None if value is None else logit_bias_pairs(value)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
        )


# --- native chat ------------------------------------------------------------------------------------------


class SamplingFields(BaseModel):
    """The decoding fields a turn request may set; what it leaves out comes from the persona."""

    max_tokens: int | None = Field(None, ge=1, description="most tokens in the reply (persona default)")
    temperature: float | None = Field(None, ge=0, le=5, description="0 is greedy (persona default)")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="makes sampling reproducible")
    stop: list[str] = Field(default_factory=list, max_length=4)
    repetition_penalty: RepetitionPenalty = None
    no_repeat_ngram: NoRepeatNgram = None
    frequency_penalty: FrequencyPenalty = None
    presence_penalty: PresencePenalty = None
    logit_bias: LogitBias = None
    logit_bias_once: LogitBiasOnce = None
    lowercase: Lowercase = None
    max_sentences: MaxSentences = None
    max_words: MaxWords = None
    wind_down: WindDown = None
    exclaim: Exclaim = None
    address: Address = None
    recall_temperature: RecallTemperature = None

    def sampling(self) -> Sampling:
        return Sampling(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=tuple(self.stop),
            repetition_penalty=self.repetition_penalty,
            no_repeat_ngram=self.no_repeat_ngram,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            logit_bias=requested_bias(self.logit_bias),
            logit_bias_once=self.logit_bias_once,
            lowercase=self.lowercase,
            max_sentences=self.max_sentences,
            max_words=self.max_words,
            wind_down=self.wind_down,
            exclaim=self.exclaim,
            address=self.address,
            recall_temperature=self.recall_temperature,
        )


class ChatRequest(SamplingFields):
    model_config = ConfigDict(extra="forbid")

    user: UserId | None = Field(None, description="required unless the API key is bound to a user")
    message: str = Field(description="the user's new message")
    stream: bool = Field(False, description="Server-Sent Events: token events, then a done event")


class ChatResponse(BaseModel):
    reply: str
    finish_reason: str
    turn: int = Field(description="this turn's index for the identity (0, 1, ...)")
    shock: float = Field(description="the standardised shock of the message")
    state_version: int = Field(description="the identity's state version after the turn")
    usage: Usage


# --- OpenAI-compatible --------------------------------------------------------------------------------------


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if self.content is None:
            return ""
        return "".join(p.text or "" for p in self.content if p.type == "text")


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request; fields SIA has no use for (tools, ...) are accepted and ignored.
    ``repetition_penalty``, ``no_repeat_ngram``, ``lowercase``, ``max_sentences``, ``max_words``, ``wind_down``, ``exclaim`` and
    ``address`` are
    SIA's own (as in vLLM's and Hugging Face's extra sampling parameters), as is ``logit_bias_once`` (each
    ``logit_bias`` pair holds only until the reply holds its token)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(description="the persona's name")
    messages: list[Message] = Field(min_length=1, description="the last user message is the new turn")
    user: UserId | None = Field(None, description="the user id (required unless the key is bound to a user)")
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    repetition_penalty: RepetitionPenalty = None
    no_repeat_ngram: NoRepeatNgram = None
    frequency_penalty: FrequencyPenalty = None
    presence_penalty: PresencePenalty = None
    logit_bias: LogitBias = None
    logit_bias_once: LogitBiasOnce = None
    lowercase: Lowercase = None
    max_sentences: MaxSentences = None
    max_words: MaxWords = None
    wind_down: WindDown = None
    exclaim: Exclaim = None
    address: Address = None
    recall_temperature: RecallTemperature = None
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    n: int = Field(1, ge=1, le=1, description="only one choice per request")
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str


class SiaTurnInfo(BaseModel):
    """What SIA adds to OpenAI's response: the identity's side of the turn."""

    turn: int
    shock: float
    state_version: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None
    sia: SiaTurnInfo


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sia"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "invalid value"),
        (401, "missing or unknown API key"),
        (403, "the key may not do this"),
        (404, "unknown persona or identity"),
        (409, "the identity stayed busy, or a conflicting change"),
        (413, "request body too large"),
        (422, "invalid body"),
    )
}
