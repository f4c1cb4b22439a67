"""A persona's reply never writes profanity or a slur the user did not (sia.model.unsaid, ReplyDecoder): the tokens that
would write one in the word being written are banned there, whatever the tokenizer's pieces."""

from __future__ import annotations

from pathlib import Path

import torch

from sia.checkpoint import DEFAULT_CHECKPOINT, load_model
from sia.model.generate import ReplyDecoder, SamplingParams, reply_events
from sia.model.tokenizer import ByteTokenizer
from sia.model.unsaid import STEMS, goes_on_a_stem, said_stems, unsaid_words, word_written

TOK, CPU = ByteTokenizer(), torch.device("cpu")
NONE = torch.tensor([], dtype=torch.long)


def spelled(reply: str, message: str, speaker: str = "bolt") -> str:
    """A greedy row whose model spells ``reply`` one character a step and would write "x" where it may not."""
    params = SamplingParams(max_new_tokens=len(reply) + 1, temperature=0.0, reply_to=message, speaker=speaker)
    row = ReplyDecoder(params, CPU, TOK)

    def restart(n: int) -> torch.Tensor:
        raise AssertionError("nothing is taken back here")

    while row.finish_reason is None:
        logits = torch.full((TOK.vocab_size,), -10.0)
        logits[ord("x")] = 5.0
        at = len(row.tokens)
        logits[ord(reply[at]) if at < len(reply) else next(iter(TOK.end_ids))] = 10.0
        reply_events(row, logits, params, 0, NONE, TOK.end_ids, restart)
    return row.text


def test_a_persona_never_completes_a_stem_the_user_did_not_write() -> None:
    assert spelled("i'm a bitch, and i live in bilbao.", "I live by the sea with my two dogs.") == (
        "I'm a bitcx, and i live in bilbao."  # its first letter a capital: the reply is not written in lower case
    )
    assert spelled("Fucking hell.", "hi") == "Fucxing hell."  # the token that would complete the stem
    assert spelled("What BULLSHIT!", "hi") == "What BULLSHIx!"  # in any case
    assert spelled("Scunthorpe, Cassandra, a cockatiel, assess.", "hi").startswith("Scunthorpe, Cassandra, a cockatiel")


def test_the_users_own_word_and_a_reply_without_a_persona_are_let_be() -> None:
    assert spelled("yes, a bitch is a female dog.", "Is my dog a bitch?") == "Yes, a bitch is a female dog."
    assert said_stems("What the FUCK, Bitch") == frozenset({"fuck", "bitch"})
    assert word_written("i'm a bitc") == "bitc" and word_written("i'm a ") == ""
    assert goes_on_a_stem("bitc") and goes_on_a_stem("") and not goes_on_a_stem("bitch") and not goes_on_a_stem("bee")
    assert spelled("i'm a bitch.", "hi", speaker="") == "I'm a bitch."  # the bare model: no persona, no rule


def test_the_bundled_tokenizers_pieces_of_a_stem_are_banned_where_they_would_write_it(smollm2_cache: Path) -> None:
    """The bundled tokenizer writes "bitch" as " b" + "itch": "itch" is banned after "b", not after "sw" ("switch"),
    and the words that hold a stem inside or begin with a shorter piece ("cockatiel", "Scunthorpe", "Nigeria",
    "shiitake", "assess", "Dickens") are written token by token as the tokenizer spells them."""
    tok = load_model(DEFAULT_CHECKPOINT, cache_dir=smollm2_cache).tokenizer
    words = unsaid_words(tok)
    itch = tok.encode(" bitch")[-1]
    assert tok.decode([itch]) == "itch"
    assert itch in words.banned("b") and itch not in words.banned("sw")
    for stem in STEMS:  # every stem's own spelling is stopped at one of its tokens, in lower case and capitalised
        for form in (" " + stem, " " + stem.capitalize(), stem):
            ids = tok.encode(form)
            assert any(t in words.banned(word_written(tok.decode(ids[:i]))) for i, t in enumerate(ids)), form
    text = " Ask about the cockatiel in Scunthorpe, Nigeria, the shiitake, assess Dickens or a bass switch."
    ids = tok.encode(text)
    for i, t in enumerate(ids):
        assert t not in words.banned(word_written(tok.decode(ids[:i]))), tok.decode(ids[: i + 1])
