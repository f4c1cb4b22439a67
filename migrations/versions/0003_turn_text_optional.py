"""Turn records may keep no text: turns.message and turns.reply become nullable (SIA_STORE_TURN_TEXT=false).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:  # SQLite rebuilds the table; PostgreSQL drops the constraints
        batch.alter_column("message", existing_type=sa.Text(), nullable=True)
        batch.alter_column("reply", existing_type=sa.Text(), nullable=True)


def downgrade() -> None:
    # a turn kept without text goes back to empty strings, the only text the old schema can hold
    op.execute("UPDATE turns SET message = '' WHERE message IS NULL")
    op.execute("UPDATE turns SET reply = '' WHERE reply IS NULL")
    with op.batch_alter_table("turns") as batch:
        batch.alter_column("message", existing_type=sa.Text(), nullable=False)
        batch.alter_column("reply", existing_type=sa.Text(), nullable=False)
