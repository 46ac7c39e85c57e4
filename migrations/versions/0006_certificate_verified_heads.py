"""certificate_verified_heads: signed points of the certificate chain a walk verified
(append-only)

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "certificate_verified_heads"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("verified_seq", sa.BigInteger(), nullable=False),
        sa.Column("chain_hash", sa.String(length=64), nullable=False),
        sa.Column("from_seq", sa.BigInteger(), nullable=False),
        sa.Column("key_id", sa.String(length=128), nullable=False),
        sa.Column("signature", sa.String(length=128), nullable=False),
        sa.Column("verified_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_certificate_verified_heads")),
    )
    op.create_index(op.f("ix_certificate_verified_heads_verified_seq"), TABLE, ["verified_seq"],
                    unique=False)
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        # reject_append_only_change() comes with revision 0001.
        op.execute(f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
                   "FOR EACH ROW EXECUTE FUNCTION reject_append_only_change()")
        op.execute(f"CREATE TRIGGER {TABLE}_no_truncate BEFORE TRUNCATE ON {TABLE} "
                   "FOR EACH STATEMENT EXECUTE FUNCTION reject_append_only_change()")
    elif dialect == "sqlite":
        for event in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER {TABLE}_no_{event.lower()} BEFORE {event} ON {TABLE} "
                       f"BEGIN SELECT RAISE(ABORT, '{event} on {TABLE}: the table is append-only'); END")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE}")
        op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_truncate ON {TABLE}")
    elif dialect == "sqlite":
        for event in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_{event}")
    op.drop_index(op.f("ix_certificate_verified_heads_verified_seq"), table_name=TABLE)
    op.drop_table(TABLE)
