"""Personas gain the form of their replies: personas.lowercase (the reply written in lower case) and
personas.max_sentences (the reply ends after that many sentences; 0 is off); existing personas get the off values.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


# plain ALTER TABLE, never a batch: SQLite would rebuild personas by dropping it, and with foreign keys on, the drop
# cascades to every identity and turn (SQLite >= 3.35 drops a column in place)


def upgrade() -> None:
    op.add_column("personas", sa.Column("lowercase", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("personas", sa.Column("max_sentences", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("personas", "max_sentences")
    op.drop_column("personas", "lowercase")
