"""The served memory benchmark's natural-set conversations: each user's own messages, then the part's unrelated turns
as `sia eval --natural` plays them, then a question per stated kind scored as the eval scores it."""

from __future__ import annotations

from benchmarks.served_memory import natural_users
from sia.learn.natural import load_fillers, load_users


def test_users_are_played_and_scored_as_the_eval_plays_them() -> None:
    users, fillers = load_users("tune"), load_fillers("tune")
    conversations = natural_users("tune", len(users), between=4)
    assert len(conversations) == len(users)
    corrected = 0
    for n, (user, (said, asked)) in enumerate(zip(users, conversations, strict=True)):
        assert said[: len(user.messages)] == list(user.messages)
        assert said[len(user.messages) :] == [fillers[(7 * n + j) % len(fillers)] for j in range(4)]
        assert sorted(kind for kind, *_ in asked) == sorted(q.kind for q in user.questions)
        for kind, value, question, gives in asked:
            newest = user.newest(kind)
            assert value == newest.value and question in [q.text for q in user.questions]
            assert gives(f"Of course: {newest.accept[0]}!")
            assert not gives("I'm afraid I don't know.")
            for older in user.older(kind):  # a correction: naming the value it replaced is not the answer
                if older.accept[0].lower() not in newest.accept[0].lower():
                    assert not gives(f"{older.accept[0]}, or maybe {newest.accept[0]}")
                    corrected += 1
    assert corrected >= 5
