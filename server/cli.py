"""The ``sia`` command: the library's commands (generate, chat, train, eval) plus the service's (db)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sia import commands as library_commands

if TYPE_CHECKING:
    from server.runtime.keys import KeyRing

log = logging.getLogger("sia")


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from server.core.config import Settings
    from server.db import migrate
    from server.db.engine import safe_url

    settings = Settings()
    migrate.upgrade(settings, args.revision)
    log.info("database %s is at revision %s", safe_url(settings.url), migrate.current_revision(settings))
    return 0


def cmd_db_downgrade(args: argparse.Namespace) -> int:
    from server.core.config import Settings
    from server.db import migrate
    from server.db.engine import safe_url

    settings = Settings()
    migrate.downgrade(settings, args.revision)
    log.info("database %s is at revision %s", safe_url(settings.url), migrate.current_revision(settings))
    return 0


def cmd_db_current(_args: argparse.Namespace) -> int:
    from server.core.config import Settings
    from server.db import migrate

    settings = Settings()
    current, head = migrate.current_revision(settings), migrate.head_revision(settings)
    state = "up to date" if current == head else f"behind head {head}; run `sia db upgrade`"
    sys.stdout.write(f"{current or 'empty (no revision)'} ({state})\n")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Migrate the SQLite default, load the model, create the default personas, serve."""
    from server.core.config import Settings
    from server.observability import configure_logging

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = Settings(**overrides)
    configure_logging(settings.log_level, json_lines=settings.log_json)  # before the imports below log anything

    import uvicorn

    from server.db import migrate
    from server.main import create_app
    from server.runtime.keys import KeyRing
    from server.store import Store

    if settings.auto_migrate and settings.url.startswith("sqlite"):
        migrate.upgrade(settings)
    store = Store(settings)
    try:
        dev_mode = KeyRing(store).dev_mode()
    finally:
        store.close()
    host = settings.host
    if dev_mode and host != "127.0.0.1":
        log.warning("development mode (no API key exists): binding 127.0.0.1 instead of %s; create a key first", host)
        host = "127.0.0.1"
    app = create_app(settings)
    uvicorn.run(app, host=host, port=settings.port, log_config=None, timeout_graceful_shutdown=10)
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    ring = _key_ring()
    record, key = ring.create("admin" if args.admin else "user", user_id=args.user, name=args.name or "")
    role = record.role
    sys.stdout.write(f"{key}\n")
    log.info(
        "created %s key %d (%s)%s; it is shown only once",
        role,
        record.id,
        record.prefix,
        f" for user {record.user_id!r}" if record.user_id else "",
    )
    return 0


def cmd_keys_list(_args: argparse.Namespace) -> int:
    for k in _key_ring().list():
        state = f"revoked {k.revoked_at:%Y-%m-%d}" if k.revoked_at else "active"
        who = f"user={k.user_id}" if k.user_id else "admin"
        sys.stdout.write(f"{k.id}\t{k.prefix}…\t{who}\t{state}\t{k.name}\n")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    record = _key_ring().revoke(args.id)
    log.info("revoked key %d (%s)", record.id, record.prefix)
    return 0


def _key_ring() -> KeyRing:
    from server.core.config import Settings
    from server.runtime.keys import KeyRing
    from server.store import Store

    return KeyRing(Store(Settings()))


def cmd_chat(args: argparse.Namespace) -> int:
    """With --user: a conversation with a stored identity (the runtime's turns); without: the library's file-backed chat."""
    if args.user is None:
        return int(library_commands.cmd_chat(args))
    from server.core.config import Settings
    from server.db import migrate
    from server.runtime.services import Services, served_model
    from server.store import Store

    settings = Settings()
    if settings.auto_migrate and settings.url.startswith("sqlite"):
        migrate.upgrade(settings)
    services = Services.over(served_model(settings, checkpoint=args.checkpoint), Store(settings))
    services.personas.ensure_defaults()
    sampling = library_commands.sampling_choices(args)
    sys.stdout.write(f"Talking to {args.persona!r} as {args.user!r}; an empty line or Ctrl-D ends the conversation.\n")
    for line in sys.stdin:
        message = line.rstrip("\n")
        if not message:
            break
        turn = services.turns.stream_turn(args.persona, args.user, message, sampling)
        for event in turn:
            sys.stdout.write(event.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        out = turn.result
        log.info("turn %d: shock %.3f, state version %d", out.turn, out.shock, out.state_version)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = library_commands.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert isinstance(sub.choices, dict)

    db = sub.add_parser("db", help="the identity database (SIA_DATABASE_URL; default SQLite under SIA_DATA_DIR)")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="apply migrations (default: to the newest)")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(func=cmd_db_upgrade)
    down = db_sub.add_parser("downgrade", help="revert migrations to REVISION ('base' removes every table)")
    down.add_argument("revision")
    down.set_defaults(func=cmd_db_downgrade)
    cur = db_sub.add_parser("current", help="print the database's revision")
    cur.set_defaults(func=cmd_db_current)

    serve = sub.add_parser("serve", help="serve the HTTP API (migrates a SQLite database, creates the default personas)")
    serve.add_argument("--host", default=None, help="address to bind (default SIA_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default SIA_PORT or 8000)")
    serve.set_defaults(func=cmd_serve)

    keys = sub.add_parser("keys", help="API keys (stored hashed; a key is shown once, when created)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key and print it")
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument("--admin", action="store_true", help="an admin key (every route, /admin included)")
    who.add_argument("--user", help="a user key bound to this user id")
    create.add_argument("--name", default=None, help="a label for listings")
    create.set_defaults(func=cmd_keys_create)
    keys_sub.add_parser("list", help="list keys (never the keys themselves)").set_defaults(func=cmd_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("id", type=int)
    revoke.set_defaults(func=cmd_keys_revoke)

    chat = sub.choices["chat"]
    chat.add_argument("--user", default=None, help="talk to the stored identity (persona, user) instead of a state file")
    chat.set_defaults(func=cmd_chat)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from server.errors import StoreError

    try:
        return library_commands.main(argv, parser=build_parser())
    except StoreError as exc:  # unknown persona, busy or corrupt identity, ...: a message, not a traceback
        log.error("%s", exc)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
