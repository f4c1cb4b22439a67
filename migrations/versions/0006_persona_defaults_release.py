"""Personas record which release of the default personas' defaults they were last brought to:
personas.defaults_release (0 for every persona stored before it existed). A service brings a default persona to
today's defaults once per release, so a field an admin later sets back to an earlier default stays as they set it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


# plain ALTER TABLE, never a batch (see 0005): SQLite would rebuild personas by dropping it, cascading to identities


def upgrade() -> None:
    op.add_column("personas", sa.Column("defaults_release", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("personas", "defaults_release")
