from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sia.model.tokenizer import ByteTokenizer, IncrementalDecoder, completed_texts


@given(st.text())
def test_any_text_round_trips(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


@given(st.text())
def test_incremental_decoding_equals_bulk_decoding(text: str) -> None:
    tok = ByteTokenizer()
    decoder = IncrementalDecoder()
    pieces = [decoder.push(i) for i in tok.encode(text)]
    assert "".join(pieces) + decoder.flush() == text
    # no piece ever contains a half character
    assert "\ufffd" not in "".join(pieces) or "\ufffd" in text


@given(st.text())
def test_completed_texts_give_each_character_to_the_token_that_ends_it(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    texts = completed_texts(tok, ids)
    assert len(texts) == len(ids) and "".join(texts) == text


def test_a_character_of_several_tokens_is_whole_in_its_last() -> None:
    tok = ByteTokenizer()
    assert completed_texts(tok, tok.encode("hi 🌼")) == ["h", "i", " ", "", "", "", "🌼"]
    assert completed_texts(tok, [*tok.encode("é"), tok.end_id]) == ["", "é", ""]  # a special token holds nothing
    assert completed_texts(tok, [195]) == ["\ufffd"]  # a character cut short at the end is marked, not lost
    assert completed_texts(tok, []) == []


def test_chat_prompt_layout_and_specials() -> None:
    tok = ByteTokenizer()
    ids = tok.chat_prompt("hé", context=[1, 2])
    assert ids == [1, 2, tok.user_id, 104, 195, 169, tok.end_id, tok.assistant_id]
    assert tok.decode(ids) == "\x01\x02hé"  # specials are dropped from text
    assert tok.vocab_size == 260 and len(tok.specials) == 4


def test_bad_input() -> None:
    tok = ByteTokenizer()
    with pytest.raises(TypeError):
        tok.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="UTF-8"):
        tok.encode("\ud800")  # a lone surrogate has no UTF-8 encoding
    assert tok.decode([0xFF, 0x41]) == "\ufffdA"
