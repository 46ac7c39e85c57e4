"""audit_seals: keyed seals over the audit chain (append-only)

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_seals",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sealed_seq", sa.BigInteger(), nullable=False),
        sa.Column("chain_hash", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("mac", sa.String(length=64), nullable=False),
        sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_seals")),
    )
    op.create_index(op.f("ix_audit_seals_sealed_seq"), "audit_seals", ["sealed_seq"], unique=False)
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        # reject_append_only_change() comes with revision 0001.
        op.execute("CREATE TRIGGER audit_seals_append_only BEFORE UPDATE OR DELETE ON audit_seals "
                   "FOR EACH ROW EXECUTE FUNCTION reject_append_only_change()")
        op.execute("CREATE TRIGGER audit_seals_no_truncate BEFORE TRUNCATE ON audit_seals "
                   "FOR EACH STATEMENT EXECUTE FUNCTION reject_append_only_change()")
    elif dialect == "sqlite":
        for event in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER audit_seals_no_{event.lower()} BEFORE {event} ON audit_seals "
                       f"BEGIN SELECT RAISE(ABORT, '{event} on audit_seals: the table is append-only'); END")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_seals_append_only ON audit_seals")
        op.execute("DROP TRIGGER IF EXISTS audit_seals_no_truncate ON audit_seals")
    elif dialect == "sqlite":
        for event in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS audit_seals_no_{event}")
    op.drop_index(op.f("ix_audit_seals_sealed_seq"), table_name="audit_seals")
    op.drop_table("audit_seals")
