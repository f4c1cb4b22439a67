"""Personas gain personas.recall_temperature: a reply to a message that asks about the user's facts, with an imprint to
answer from, is decoded at no more than this temperature (0: greedy; NULL: off); existing personas get it off (NULL),
and the service brings the default personas to their release's default.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


# plain ALTER TABLE, never a batch (see 0005): SQLite would rebuild personas by dropping it, cascading to identities


def upgrade() -> None:
    op.add_column("personas", sa.Column("recall_temperature", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("personas", "recall_temperature")
