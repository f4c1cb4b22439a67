"""Personas gain personas.wind_down: in a reply's last this many tokens before its token limit, its end is pulled
nearer at every token, so a reply the limit would cut in a sentence ends at a sentence's end first (0 is off). Existing
personas get it off, and the service brings the default personas to their release's default.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


# plain ALTER TABLE, never a batch (see 0005): SQLite would rebuild personas by dropping it, cascading to identities


def upgrade() -> None:
    op.add_column("personas", sa.Column("wind_down", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("personas", "wind_down")
