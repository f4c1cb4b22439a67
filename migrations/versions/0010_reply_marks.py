"""Personas gain the marks of a reply's form that the decoding writes: personas.exclaim (a full stop right after a word
written as an exclamation mark until the reply holds one) and personas.address (a form of address, such as ", sir",
written before the reply's first sentence end after a word unless the reply says it; "" is off). Existing personas get
both off, and the service brings the default personas to their release's default.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


# plain ALTER TABLE, never a batch (see 0005): SQLite would rebuild personas by dropping it, cascading to identities


def upgrade() -> None:
    op.add_column("personas", sa.Column("exclaim", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("personas", sa.Column("address", sa.String(40), nullable=False, server_default=""))


def downgrade() -> None:
    op.drop_column("personas", "address")
    op.drop_column("personas", "exclaim")
