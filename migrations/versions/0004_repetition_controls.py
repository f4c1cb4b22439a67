"""Personas gain repetition controls for their replies: personas.repetition_penalty (1 is off) and
personas.no_repeat_ngram (0 is off); existing personas get the off values.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


# plain ALTER TABLE, never a batch: SQLite would rebuild personas by dropping it, and with foreign keys on, the drop
# cascades to every identity and turn (SQLite >= 3.35 drops a column in place)


def upgrade() -> None:
    op.add_column("personas", sa.Column("repetition_penalty", sa.Float(), nullable=False, server_default="1.0"))
    op.add_column("personas", sa.Column("no_repeat_ngram", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("personas", "no_repeat_ngram")
    op.drop_column("personas", "repetition_penalty")
