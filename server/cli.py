"""The ``sia`` command: the library's commands (generate, chat, train, eval) plus the service's (db)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from sia import cli as library_cli

log = logging.getLogger("sia")


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from server.core.config import Settings
    from server.db import migrate

    settings = Settings()
    migrate.upgrade(settings, args.revision)
    log.info("database %s is at revision %s", _safe_url(settings.url), migrate.current_revision(settings))
    return 0


def cmd_db_downgrade(args: argparse.Namespace) -> int:
    from server.core.config import Settings
    from server.db import migrate

    settings = Settings()
    migrate.downgrade(settings, args.revision)
    log.info("database %s is at revision %s", _safe_url(settings.url), migrate.current_revision(settings))
    return 0


def cmd_db_current(_args: argparse.Namespace) -> int:
    from server.core.config import Settings
    from server.db import migrate

    settings = Settings()
    current, head = migrate.current_revision(settings), migrate.head_revision(settings)
    state = "up to date" if current == head else f"behind head {head}; run `sia db upgrade`"
    sys.stdout.write(f"{current or 'empty (no revision)'} ({state})\n")
    return 0


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def build_parser() -> argparse.ArgumentParser:
    parser = library_cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return library_cli.main(argv, parser=build_parser())


if __name__ == "__main__":
    raise SystemExit(main())
