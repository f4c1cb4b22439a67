"""Personas gain personas.max_words: past this many words, a reply's end is pulled nearer at every further word, so it
ends soon after, at a point of the model's choosing (0 is off). Existing personas get it off, and the service brings
the default personas to their release's default.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


# plain ALTER TABLE, never a batch (see 0005): SQLite would rebuild personas by dropping it, cascading to identities


def upgrade() -> None:
    op.add_column("personas", sa.Column("max_words", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("personas", "max_words")
