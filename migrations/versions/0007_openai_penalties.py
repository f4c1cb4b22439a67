"""Personas gain OpenAI's decoding controls as defaults: personas.frequency_penalty and personas.presence_penalty (0:
off) and personas.logit_bias (a JSON object of token id -> bias; {}: none); existing personas get them off.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


# plain ALTER TABLE, never a batch (see 0005): SQLite would rebuild personas by dropping it, cascading to identities


def upgrade() -> None:
    op.add_column("personas", sa.Column("frequency_penalty", sa.Float(), nullable=False, server_default="0"))
    op.add_column("personas", sa.Column("presence_penalty", sa.Float(), nullable=False, server_default="0"))
    op.add_column("personas", sa.Column("logit_bias", sa.JSON(), nullable=False, server_default=sa.text("'{}'")))


def downgrade() -> None:
    op.drop_column("personas", "logit_bias")
    op.drop_column("personas", "presence_penalty")
    op.drop_column("personas", "frequency_penalty")
