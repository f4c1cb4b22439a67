from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text, update

from server.db.engine import is_sqlite
from server.db.tables import IdentityRow
from server.errors import BusyError, ConflictError, CorruptStateError, NotFoundError
from server.records import Blob, NewTurn, PersonaRecord
from server.store import PRUNE_EVERY, Store, sha256
from sia.identity.turn import TurnReply


def blob(tag: bytes) -> Blob:
    return Blob(data=b"state:" + tag, format_version=1, shock_count=0, shock_mean=0.0, shock_m2=0.0)


def initial(_: PersonaRecord) -> Blob:
    return blob(b"init")


TURN = NewTurn(
    reply="hello", finish_reason="stop", shock=0.5, nll=2.0, prompt_tokens=10, completion_tokens=5, message="hi", latency_ms=12.0
)


def test_persona_crud(store: Store) -> None:
    p = store.create_persona("ana", description="a test", preamble="[ana]", alpha=0.2, temperature=0.5)
    assert (p.name, p.description, p.preamble, p.alpha, p.decay, p.temperature, p.max_tokens) == (
        "ana",
        "a test",
        "[ana]",
        0.2,
        None,
        0.5,
        64,
    )
    with pytest.raises(ConflictError, match="already exists"):
        store.create_persona("ana")
    assert [x.name for x in store.list_personas()] == ["ana"]
    updated = store.update_persona("ana", decay=0.9, description="changed")
    assert (updated.decay, updated.description, updated.alpha) == (0.9, "changed", 0.2)
    assert updated.updated_at >= p.updated_at
    with pytest.raises(ValueError, match="unknown persona fields"):
        store.update_persona("ana", colour="green")
    store.delete_persona("ana")
    with pytest.raises(NotFoundError):
        store.get_persona("ana")


def test_identity_is_created_once_and_turns_are_recorded(store: Store) -> None:
    store.create_persona("p")
    with pytest.raises(NotFoundError, match="identity"):
        store.acquire("p", "u")  # no create callback: unknown identity
    with pytest.raises(NotFoundError, match="persona"):
        store.acquire("nope", "u", create=initial)
    lease = store.acquire("p", "u", create=initial)
    assert (lease.version, lease.turn_count, lease.state) == (1, 0, b"state:init")
    assert store.get_identity("p", "u").busy
    version = store.commit(lease, blob(b"one"), reason="turn", turn=TURN)
    assert version == 2
    ident = store.get_identity("p", "u")
    assert (ident.version, ident.turn_count, ident.busy, ident.state_sha256) == (2, 1, False, sha256(b"state:one"))
    assert store.read_state("p", "u") == (2, b"state:one")
    [turn] = store.turns("p", "u")
    assert (turn.index, turn.message, turn.reply, turn.version_before, turn.version_after) == (0, "hi", "hello", 1, 2)
    assert [(v.version, v.reason, v.turn_index) for v in store.history("p", "u")] == [(2, "turn", 0), (1, "init", None)]
    assert store.read_version("p", "u", 1) == b"state:init"
    assert store.count_identities("p") == 1


def test_a_turn_kept_without_text_and_the_newest_turns_first(store: Store) -> None:
    """A turn of privacy mode is stored with NULL message and reply (read back with SQL); recent_turns pages the
    identity's turns newest first."""
    store.create_persona("p")
    for i in range(5):
        lease = store.acquire("p", "u", create=initial)
        turn = TURN if i % 2 == 0 else NewTurn.of(TurnReply("yes", "stop", 0.1, 1.0, 3, 1), "secret", 1.0, keep_text=False)
        store.commit(lease, blob(b"%d" % i), reason="turn", turn=turn)
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT message, reply, completion_tokens FROM turns ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [("hi", "hello", 5), (None, None, 1)] * 2 + [("hi", "hello", 5)]
    read = store.turns("p", "u")
    assert [(t.message, t.reply, t.text_kept) for t in read[:2]] == [("hi", "hello", True), ("", "", False)]
    assert (read[1].finish_reason, read[1].completion_tokens, read[1].latency_ms) == ("stop", 1, 1.0)
    assert [t.index for t in store.recent_turns("p", "u", limit=2)] == [4, 3]
    assert [t.index for t in store.recent_turns("p", "u", limit=2, offset=2)] == [2, 1]
    assert [t.index for t in store.recent_turns("p", "u", limit=10, offset=4)] == [0]
    kept = NewTurn.of(TurnReply("yes", "stop", 0.1, 1.0, 3, 1), "said", 2.5, keep_text=True)
    assert (kept.message, kept.reply, kept.completion_tokens, kept.latency_ms, kept.text_kept) == ("said", "yes", 1, 2.5, True)


class StoreClock:
    """Stands in for the ``time`` module inside server.store, so that a wait is counted rather than timed.

    ``monotonic`` is the sum of what the store slept (the time its queries took does not count), so a deadline
    passes only by waiting; each sleep is real, and sets ``waited``. ``time`` (lease expiry) is the real clock.
    A store that polled without ever sleeping would spin forever on this clock: a hang guard fails it instead.
    """

    def __init__(self) -> None:
        self.sleeps: list[float] = []
        self.waited = threading.Event()
        self.hang_guard = time.monotonic() + 60

    def monotonic(self) -> float:
        assert time.monotonic() < self.hang_guard, "the store kept polling without waiting in between"
        return sum(self.sleeps)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.waited.set()
        time.sleep(seconds)

    def time(self) -> float:
        return time.time()


def test_lease_makes_waiters_busy_then_lets_them_in(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.create_persona("p")
    lease = store.acquire("p", "u", create=initial)
    clock = StoreClock()
    monkeypatch.setattr("server.store.time", clock)
    with pytest.raises(BusyError, match="busy"):
        store.acquire("p", "u", timeout=0.2)
    assert len(clock.sleeps) >= 2  # it found the identity held, waited and looked again, more than once ...
    assert sum(clock.sleeps) == pytest.approx(0.2)  # ... until its whole timeout was spent, and no longer
    store.acquire("p", "other", create=initial)  # another identity is not blocked

    clock = StoreClock()
    monkeypatch.setattr("server.store.time", clock)
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(store.acquire("p", "u", timeout=60).version))
    waiter.start()
    assert clock.waited.wait(timeout=60)  # the waiter found the identity held and is waiting for it
    assert got == []
    store.commit(lease, blob(b"x"), reason="turn", turn=TURN)
    waiter.join(timeout=60)
    assert got == [2]  # let in once the holder committed, the waiter saw the committed state


def test_waiters_get_the_identity_in_the_order_they_came(store: Store) -> None:
    store.create_persona("p")
    lease = store.acquire("p", "u", create=initial)
    order: list[int] = []

    def turn(i: int) -> None:
        held = store.acquire("p", "u", timeout=60)
        order.append(i)
        store.commit(held, blob(str(i).encode()), reason="turn", turn=TURN)

    waiters = []
    for i in range(5):
        waiters.append(threading.Thread(target=turn, args=(i,)))
        waiters[-1].start()
        while store.waiting("p", "u") < i + 1:  # in line before the next one comes
            time.sleep(0.001)
    store.commit(lease, blob(b"x"), reason="turn", turn=TURN)
    for w in waiters:
        w.join(timeout=60)
    assert order == [0, 1, 2, 3, 4]
    assert store.waiting("p", "u") == 0
    assert store.get_identity("p", "u").turn_count == 6


def test_a_waiter_that_gives_up_leaves_the_line(store: Store) -> None:
    store.create_persona("p")
    lease = store.acquire("p", "u", create=initial)
    first = threading.Thread(target=lambda: store.release(store.acquire("p", "u", timeout=60)))
    first.start()
    while store.waiting("p", "u") < 1:
        time.sleep(0.001)
    with pytest.raises(BusyError, match="busy"):
        store.acquire("p", "u", timeout=0.05)  # behind the first waiter: it gives up and leaves
    assert store.waiting("p", "u") == 1
    store.release(lease)
    first.join(timeout=60)
    assert not first.is_alive() and store.waiting("p", "u") == 0
    store.release(store.acquire("p", "u", timeout=1))  # the line is gone: the identity is free


def test_release_writes_nothing(store: Store) -> None:
    store.create_persona("p")
    lease = store.acquire("p", "u", create=initial)
    store.release(lease)
    ident = store.get_identity("p", "u")
    assert (ident.version, ident.turn_count, ident.busy) == (1, 0, False)
    assert store.turns("p", "u") == []


def test_expired_lease_is_taken_over_and_its_commit_refused(store: Store) -> None:
    store.create_persona("p")
    store.settings.lease_s = 0.05
    stale = store.acquire("p", "u", create=initial)
    store.settings.lease_s = 300.0  # the next hold is an ordinary one
    deadline = time.monotonic() + 30
    while store.get_identity("p", "u").busy:  # until the stale hold expires
        assert time.monotonic() < deadline, "the 0.05 s hold never expired"
        time.sleep(0.01)
    fresh = store.acquire("p", "u", timeout=1)  # the stale hold is taken over
    store.commit(fresh, blob(b"fresh"), reason="turn", turn=TURN)
    with pytest.raises(ConflictError, match="changed while"):
        store.commit(stale, blob(b"stale"), reason="turn", turn=TURN)
    assert store.read_state("p", "u") == (2, b"state:fresh")
    assert len(store.turns("p", "u")) == 1


def test_history_is_pruned_to_the_retention(store: Store) -> None:
    store.create_persona("p")
    retention = store.settings.history_retention
    for i in range(retention + 5):
        store.commit(store.acquire("p", "u", create=initial), blob(str(i).encode()), reason="turn", turn=TURN)
    versions = [v.version for v in store.history("p", "u")]
    last = retention + 6
    assert retention <= len(versions) < retention + PRUNE_EVERY
    assert versions == list(range(last, last - len(versions), -1))  # the newest, contiguous
    with pytest.raises(NotFoundError, match="no retained version 1"):
        store.read_version("p", "u", 1)
    assert [t.index for t in store.turns("p", "u", limit=1000)] == list(range(retention + 5))  # turns are not pruned


def test_snapshots(store: Store) -> None:
    store.create_persona("p")
    store.commit(store.acquire("p", "u", create=initial), blob(b"a"), reason="turn", turn=TURN)
    snap = store.create_snapshot("p", "u", "before")
    assert (snap.name, snap.version) == ("before", 2)
    old = store.create_snapshot("p", "u", "origin", version=1)
    assert old.version == 1
    with pytest.raises(ConflictError, match="already has a snapshot"):
        store.create_snapshot("p", "u", "before")
    with pytest.raises(NotFoundError):
        store.create_snapshot("p", "u", "x", version=99)
    assert store.read_snapshot("p", "u", "origin")[1] == b"state:init"
    assert [s.name for s in store.list_snapshots("p", "u")] == ["before", "origin"]
    store.delete_snapshot("p", "u", "before")
    with pytest.raises(NotFoundError):
        store.read_snapshot("p", "u", "before")


def test_checksum_mismatch_is_corrupt_and_isolated(store: Store) -> None:
    store.create_persona("p")
    store.release(store.acquire("p", "bad", create=initial))
    store.release(store.acquire("p", "good", create=initial))
    with store.transaction() as s:
        s.execute(update(IdentityRow).where(IdentityRow.user_id == "bad").values(state=b"state:flipped"))
    with pytest.raises(CorruptStateError, match="checksum"):
        store.read_state("p", "bad")
    with pytest.raises(CorruptStateError, match="checksum"):
        store.acquire("p", "bad")
    assert not store.get_identity("p", "bad").busy  # a refused hold is released
    lease = store.acquire("p", "bad", verify=False)  # what a repair (import, reset, rollback) uses
    store.commit(lease, blob(b"repaired"), reason="import")
    assert store.read_state("p", "bad") == (2, b"state:repaired")
    assert store.read_state("p", "good") == (1, b"state:init")


def test_deleting_a_persona_removes_its_identities(store: Store) -> None:
    store.create_persona("p")
    store.commit(store.acquire("p", "u", create=initial), blob(b"a"), reason="turn", turn=TURN)
    store.create_snapshot("p", "u", "s")
    store.delete_persona("p")
    store.create_persona("p")
    with pytest.raises(NotFoundError):
        store.get_identity("p", "u")


def test_reads_do_not_wait_for_a_writer(store: Store) -> None:
    store.create_persona("p")
    impatient = Store(store.settings.model_copy(update={"sqlite_busy_timeout_ms": 0}))  # waiting for a lock: BusyError
    try:
        with store.transaction() as writer:  # holds SQLite's write lock (BEGIN IMMEDIATE) until the block ends
            writer.execute(update(IdentityRow).values(turn_count=0))
            assert impatient.get_persona("p").name == "p"  # a reader that waited for the lock would raise BusyError
            if is_sqlite(store.engine):  # the lock is held: a second writer is refused at once
                with pytest.raises(BusyError, match="locked"), impatient.transaction() as other:
                    other.execute(update(IdentityRow).values(turn_count=0))
    finally:
        impatient.close()
