"""What generation, turns and the runtime rely on, whatever the model family: ``IdentityModel``, a causal LM
conditioned on one identity state per row, and ``ModelOutput``, what its forward returns.

Implemented by the native model (sia.model.native.SIAModel) and the pretrained backbone
(sia.backbones.llama.LlamaModel). Notation: B batch, L tokens in this call, C residual width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from sia.identity.imprint import KINDS, Imprint, ImprintEntries, asks_a_fact
from sia.identity.state import IdentityState, SelfUpdate, TurnSummary
from sia.model.conditioning import Conditioning
from sia.model.config import AnyConfig
from sia.model.kv_cache import KVCache
from sia.model.language import ECHO_LEAN_KINDS, about_the_user, asked_parts, asks, names_kind, of_the_persona
from sia.model.summary_sums import SummarySums
from sia.model.tokenizer import Tokenizer

__all__ = ["IdentityModel", "ModelOutput", "WordsRead"]


@dataclass
class ModelOutput:
    logits: Tensor  # (B, L, vocab)
    stats: SummarySums
    memory: Tensor | None = None  # (B, K, C) final hidden states of the memory tokens, when they were read


@dataclass
class WordsRead:
    """What ``read_words`` returns: a message's tokens as the base model reads them, what an imprint keeps."""

    keys: Tensor  # (n_layer, H_kv, L, d) float32, pre-rotation
    values: Tensor  # (n_layer, H_kv, L, d) float32
    logits: Tensor | None = None  # (L, V), when asked for
    kinds: Tensor | None = None  # (L, len(KINDS)): each token's probabilities of stating each kind (the kind tagger)
    start: int = 0  # the position of its first token (a read after a shared prefix covers the tokens from there)


class IdentityModel(nn.Module):
    """What generation, turns and the runtime rely on: a causal LM conditioned on one identity state per row.

    Subclasses (the native SIAModel, sia.backbones.llama.LlamaModel) build ``condition``, ``forward``, ``summarize`` and
    ``new_cache``; the stacking of states, pooling and the variant checks are shared here.
    """

    config: AnyConfig
    tokenizer: Tokenizer
    wte: nn.Embedding
    self_update: SelfUpdate
    pool: nn.Linear | None
    # whether a batched row computes bit for bit what it computes alone (LlamaModel with bfloat16 packed weights):
    # then a padded group is prefilled row by row (sia.model.batching)
    exact_rows: bool = False

    def condition(
        self,
        trace: Tensor,
        self_state: Tensor,
        imprint: ImprintEntries | None = None,
        reads_from: Tensor | None = None,
        asked: Tensor | None = None,
    ) -> Conditioning:
        raise NotImplementedError

    def decode_in(self, dtype: torch.dtype) -> IdentityModel:
        """Cast the weights to ``dtype`` to decode in it (bfloat16 halves them and, on GPUs and on CPUs with bfloat16
        instructions, decodes faster), keeping the self update, which writes the identity state, in float32; the
        turn statistics are pooled in float32 either way. Returns the model."""
        if not dtype.is_floating_point:
            raise ValueError(f"a model decodes in a floating-point dtype; got {dtype}")
        self.to(dtype)
        self.self_update.float()
        return self

    def new_cache(self, cond: Conditioning, max_tokens: int) -> KVCache:
        raise NotImplementedError

    def read_words(self, idx: Tensor, *, logits: bool = False, shared: int = 0) -> WordsRead:
        """The tokens idx (1, L) as the base model reads them: what an imprint keeps (after the first ``shared``, a
        prefix whose read is kept). Only a model that keeps an imprint has them."""
        raise NotImplementedError(f"{type(self).__name__} keeps no imprint")

    def summarize(self, stats: SummarySums) -> TurnSummary:
        raise NotImplementedError

    def forward(
        self,
        idx: Tensor,
        cond: Conditioning,
        *,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        summary_mask: Tensor | None = None,
        logits_from: int = 0,
    ) -> ModelOutput:
        raise NotImplementedError

    @property
    def stateful(self) -> bool:
        """False for the plain-attention variant, which ignores identity state."""
        return self.config.attention != "dot"

    @property
    def memory_after_reply(self) -> int:
        """Memory tokens a generation reads after the reply, in its own cache: the write's (none when the model ignores
        the state)."""
        return self.config.memory_tokens if self.stateful else 0

    @property
    def prefix_len(self) -> int:
        """Keys before the first token: the self slot, or none."""
        return 1 if self.stateful else 0

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    def _check_state_shapes(self, trace: Tensor, self_state: Tensor) -> None:
        c = self.config
        if trace.dim() != 5 or trace.shape[1:] != c.trace_shape:
            raise ValueError(f"trace must be (B, {', '.join(map(str, c.trace_shape))}); got {tuple(trace.shape)}")
        if self_state.shape != (trace.shape[0], c.d_self):
            raise ValueError(f"self_state must be ({trace.shape[0]}, {c.d_self}); got {tuple(self_state.shape)}")

    def _positions_and_weights(
        self, idx: Tensor, cond: Conditioning, cache: KVCache | None, positions: Tensor | None, summary_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """forward's checks and defaults: positions (B, L), next after the cache unless given, and the summary
        weight (B, L, 1) of each token (1 unless summary_mask says otherwise)."""
        B, L = idx.shape
        if cond.batch_size != B:
            raise ValueError(f"idx has {B} rows but the conditioning has {cond.batch_size}")
        start = 0 if cache is None else cache.tokens
        if positions is None:
            positions = torch.arange(start, start + L, device=idx.device).expand(B, L)
        if int(positions.max()) >= self.config.block_size:
            raise ValueError(f"position {int(positions.max())} exceeds the context of {self.config.block_size} tokens")
        weight = (torch.ones(B, L, device=idx.device) if summary_mask is None else summary_mask.float()).unsqueeze(-1)
        return positions, weight

    def condition_states(
        self,
        states: Sequence[IdentityState],
        reads_from: Sequence[int] | None = None,
        messages: Sequence[Sequence[int]] | None = None,
    ) -> Conditioning:
        """Stack one IdentityState per row into a Conditioning; ``reads_from``: per row, the first position that reads
        the imprint (a turn's context, the persona's prompt, does not); ``messages``: per row, the tokens of the
        user's message, whose asked kind moves the imprint's entries (config.imprint_ask_bias; asked only where some
        row's imprint holds an entry of known kind, or a kept token the copy read weighs). A message that speaks of
        the persona and not of its writer ("What's your name?", ``sia.model.language.of_the_persona``) reads no imprint:
        the user's words answer questions about the user, never about the persona. Nor does a message that asks nothing
        (``sia.model.language.asks``: "On weekends I go bouldering", "I moved to York last month"): the imprint answers
        questions, and the reply to what a user tells is the persona's own, not an answer about their facts ("You're
        Priya, unless you've changed it since!"). Nor does a message asking about a kind of fact
        (config.imprint_untold) that the imprint holds nothing of (``ImprintEntries.untold``: no span so labelled, and
        none whose kept text names such a value, ``sia.model.language.names_kind``; where the imprint keeps no text, only
        the kinds of config.imprint_untold_by_label): its row's reply says the user has not told it
        (``Conditioning.untold``). A row asking about a kind of config.imprint_echo, with an imprint to answer from,
        opens its reply by saying back the user's words (``Conditioning.echo``). A row whose message asks what the
        persona knows of the user as a whole (``sia.model.language.about_the_user``), with the text of labelled spans
        kept, is answered with those clauses (``Conditioning.recollection``)."""
        if not states:
            raise ValueError("need at least one identity state")
        for state in states:
            state.validate(self.config)
        trace = torch.stack([s.trace for s in states]).to(self.device)
        selves = torch.stack([s.self_state for s in states]).to(self.device)
        if self.config.imprint_tokens:
            if messages is not None and len(messages) != len(states):
                raise ValueError(f"need one message per state; got {len(messages)} for {len(states)}")
            texts = None if messages is None else [self.tokenizer.decode(list(m)) for m in messages]
            # a message of the persona's, or one that asks nothing, reads no imprint
            unread = [False] * len(states) if texts is None else [of_the_persona(t) or not asks(t) for t in texts]
            held = [None if quiet else s.imprint for s, quiet in zip(states, unread, strict=True)]
            readable = list(held)  # what each row may answer from: nothing for a message of the persona's
            entries = ImprintEntries.stack(held, self.config.imprint_shape, torch.float32)
            start = None if reads_from is None else torch.tensor(list(reads_from), dtype=torch.long, device=self.device)
            copies = bool(self.config.imprint_copy) and bool((entries.token >= 0).any())
            reads_kinds = copies or bool((entries.kind > 0).any())
            kinds = self.config.imprint_untold or ()
            if messages is not None and self.config.imprint_ask_bias and (reads_kinds or (kinds and bool(entries.filled.any()))):
                asked = self.asked_kinds(messages)
                untold = [
                    k if k and self._untold(imprint, k) else ""
                    for k, imprint in zip(entries.untold(asked, kinds), readable, strict=True)
                ]
                if any(untold):  # nothing of the asked kind was told: such a row reads no imprint, its reply says so
                    held = [None if kind else h for h, kind in zip(held, untold, strict=True)]
                    entries = ImprintEntries.stack(held, self.config.imprint_shape, torch.float32)
                echo = entries.echoed(asked, self.config.imprint_echo or ())  # an untold row holds nothing: no echo
                cond = self.condition(trace, selves, entries.to(self.device), start, asked if reads_kinds else None)
                cond = replace(
                    cond,
                    untold=tuple(untold) if any(untold) else None,
                    echo=tuple(echo) if any(echo) else None,
                    echo_words=self._echo_words(entries, echo),
                )
                return self._recollecting(cond, readable, texts)
            return self._recollecting(self.condition(trace, selves, entries.to(self.device), start), readable, texts)
        return self.condition(trace, selves)

    def _echo_words(self, entries: ImprintEntries, echo: Sequence[str]) -> tuple[tuple[int, ...], ...] | None:
        """Per row whose reply echoes a kind of ``ECHO_LEAN_KINDS`` (``echo``), the tokens that go on from "I" in its
        imprint's spans but a name's, as a reply says them after "you" ("I fix cars": " fix"; "I'm a nurse": "'re"),
        which the reply's first token after its opening leans to (``SamplingParams.echo_words``); None where no row has
        any."""
        if not any(kind in ECHO_LEAN_KINDS for kind in echo):
            return None
        tok = self.tokenizer
        first = {ids[0] for text in ("I", " I", "i", " i") if len(ids := tok.encode(text)) == 1}
        said = {"'m": "'re", "\u2019m": "'re", " am": " are", " was": " were"}
        token, span, labelled = entries.token.cpu(), entries.span.cpu(), entries.kind.cpu()
        name = KINDS.index("name")
        out = []
        for b, kind in enumerate(echo):
            words: list[int] = []
            for n in range(1, token.shape[1] if kind in ECHO_LEAN_KINDS else 0):
                t = int(token[b, n])
                if t < 0 or int(token[b, n - 1]) not in first or int(span[b, n]) != int(span[b, n - 1]):
                    continue
                if int(labelled[b, n]) == name:  # "I'm Eirik": what follows "I" there says who the user is, not what they do
                    continue
                text = tok.decode([t])
                if text in said:
                    ids = tok.encode(said[text])
                    words += ids[:1] if len(ids) == 1 else []
                elif (text[:1] == " " and text[1:2].isalpha()) or text in ("'ve", "'d", "'ll"):
                    words.append(t)
            out.append(tuple(words))
        return tuple(out) if any(out) else None

    def _recollecting(self, cond: Conditioning, imprints: Sequence[Imprint | None], texts: Sequence[str] | None) -> Conditioning:
        """``cond`` with ``recollection`` set (the clauses one a line) for the rows whose message asks what the persona
        knows of the user and whose imprint keeps the text of clauses labelled with a kind of fact; and for the rows
        whose message joins questions about two kinds of fact or more ("What's my name and what do I do?": the ask head
        reads each part, ``sia.model.language.asked_parts``) whose imprint keeps such clauses of every kind asked.
        ``imprints``: per row, what it may answer from (None for a message of the persona's, ``of_the_persona``: "What's
        your name and what do you do?"); ``texts``: the messages (None: none)."""
        if texts is None:
            return cond
        decode = self.tokenizer.decode
        told = []
        for imprint, text in zip(imprints, texts, strict=True):
            clauses: list[str] = []
            if imprint is not None and about_the_user(text):
                clauses = imprint.recollection(decode)
            elif imprint is not None and imprint.used:
                kinds = self._kinds_asked(asked_parts(text))
                if len(kinds) > 1:
                    clauses = imprint.recollection(decode, kinds)
            told.append("\n".join(clauses))
        return replace(cond, recollection=tuple(told)) if any(told) else cond

    def _untold(self, imprint: Imprint | None, kind: str) -> bool:
        """Whether a question about ``kind``, which no span of ``imprint`` is labelled with, gets the untold reply: not
        where a kept span's text names a value of it whatever its label ("lilac is everything to me",
        ``sia.model.language.names_kind``: the user told it, and the read answers); where some span keeps no text
        (SIA_STORE_TURN_TEXT=false), only for the kinds the labels alone decide (config.imprint_untold_by_label)."""
        if imprint is None:
            return True
        decode = self.tokenizer.decode
        texts = [None if s.tokens is None else decode(list(s.tokens)) for s in imprint.spans()]
        if any(text is not None and names_kind(kind, text) for text in texts):
            return False
        by_label = self.config.imprint_untold_by_label
        return all(text is not None for text in texts) or by_label is None or kind in by_label

    def _kinds_asked(self, parts: Sequence[str]) -> set[str]:
        """The kinds of fact the questions ``parts`` ask about, each part's likeliest where the ask head more likely
        reads a fact than none in every part; none without an ask head or parts."""
        if not parts or not self.config.imprint_ask_bias:
            return set()
        asked = self.asked_kinds([self.tokenizer.encode(part) for part in parts]).cpu()
        if not bool(asks_a_fact(asked).all()):
            return set()
        return {KINDS[int(k) + 1] for k in asked[:, 1:].argmax(-1)}

    def asked_kinds(self, rows: Sequence[Sequence[int]]) -> Tensor:
        """What kind of fact each message (its tokens) asks about, (B, len(KINDS)) probabilities; a model that keeps
        no imprint has no such head."""
        raise ValueError(f"{type(self).__name__} has no ask head")

    def _pool(self, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Online-softmax pooling sums of x (B, L, C) over tokens with weight (B, L, 1) > 0."""
        B, L, _ = x.shape
        # (B, L); the scores in the pool's own dtype (a bfloat16 model), the sums in x's (float32)
        scores = x.new_zeros(B, L) if self.pool is None else self.pool(x.to(self.pool.weight.dtype)).squeeze(-1).to(x.dtype)
        counted = weight.squeeze(-1) > 0
        scores = scores.masked_fill(~counted, float("-inf"))
        top = scores.max(dim=1).values  # (B,)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a row with nothing counted
        e = torch.exp(scores - top.unsqueeze(-1)) * weight.squeeze(-1)  # (B, L)
        return (e.unsqueeze(-1) * x).sum(dim=1), top, e.sum(dim=1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
