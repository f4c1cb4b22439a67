"""The identity store: personas, identities, turns, state versions, snapshots.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _timestamps() -> list[sa.Column[object]]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "personas",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("preamble", sa.Text(), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=True),
        sa.Column("decay", sa.Float(), nullable=True),
        sa.Column("eta", sa.Float(), nullable=True),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("top_p", sa.Float(), nullable=True),
        sa.Column("top_k", sa.Integer(), nullable=True),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("initial_state", sa.LargeBinary(), nullable=True),
        *_timestamps(),
        sa.UniqueConstraint("name", name="uq_personas_name"),
    )
    op.create_table(
        "identities",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("persona_id", sa.Integer(), sa.ForeignKey("personas.id", ondelete="CASCADE"), nullable=False),
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.Column("state_sha256", sa.String(64), nullable=False),
        sa.Column("format_version", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("turn_count", sa.Integer(), nullable=False),
        sa.Column("shock_count", sa.Integer(), nullable=False),
        sa.Column("shock_mean", sa.Float(), nullable=False),
        sa.Column("shock_m2", sa.Float(), nullable=False),
        sa.Column("lease_token", sa.String(36), nullable=True),
        sa.Column("lease_expires", sa.Float(), nullable=True),
        *_timestamps(),
        sa.UniqueConstraint("persona_id", "user_id", name="uq_identities_persona_user"),
    )
    op.create_index("ix_identities_persona_id", "identities", ["persona_id"])
    op.create_table(
        "turns",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("identity_id", sa.Integer(), sa.ForeignKey("identities.id", ondelete="CASCADE"), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("reply", sa.Text(), nullable=False),
        sa.Column("finish_reason", sa.String(16), nullable=False),
        sa.Column("shock", sa.Float(), nullable=False),
        sa.Column("nll", sa.Float(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("version_before", sa.Integer(), nullable=False),
        sa.Column("version_after", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("identity_id", "index", name="uq_turns_identity_index"),
    )
    op.create_index("ix_turns_identity_id", "turns", ["identity_id"])
    for table, extra in (
        ("state_versions", [sa.Column("reason", sa.String(64), nullable=False), sa.Column("turn_index", sa.Integer())]),
        ("snapshots", [sa.Column("name", sa.String(128), nullable=False)]),
    ):
        key = "version" if table == "state_versions" else "name"
        op.create_table(
            table,
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("identity_id", sa.Integer(), sa.ForeignKey("identities.id", ondelete="CASCADE"), nullable=False),
            sa.Column("version", sa.Integer(), nullable=False),
            sa.Column("state", sa.LargeBinary(), nullable=False),
            sa.Column("state_sha256", sa.String(64), nullable=False),
            *extra,
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.UniqueConstraint("identity_id", key, name=f"uq_{table}_identity_{key}"),
        )
        op.create_index(f"ix_{table}_identity_id", table, ["identity_id"])


def downgrade() -> None:
    for table in ("snapshots", "state_versions", "turns", "identities"):
        op.drop_table(table)
    op.drop_table("personas")
