"""hardening: stage claim tokens, verification reports in the database (append-only),
and the version of the AES-GCM associated data of each ciphertext

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 10:00:00

Existing ciphertexts keep associated data version 1 (the column name only) and stay
readable; beat's `erasure.reseal_ciphertexts` re-encrypts them bound to their row
(version 2, deletion/domain/services/sealing.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | Sequence[str] | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = 'verification_reports'


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.add_column(sa.Column('claim_token', sa.String(length=32), nullable=True))
    with op.batch_alter_table('erasure_requests') as batch_op:
        batch_op.add_column(sa.Column('subject_ad_version', sa.Integer(), nullable=False,
                                      server_default=sa.text('1')))
    with op.batch_alter_table('recipients') as batch_op:
        batch_op.add_column(sa.Column('secret_ad_version', sa.Integer(), nullable=False,
                                      server_default=sa.text('1')))
    op.create_table(TABLE,
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('round', sa.Integer(), nullable=False),
    sa.Column('candidate_checkpoint_id', sa.Integer(), nullable=False),
    sa.Column('report', sa.Text(), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('passed', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['candidate_checkpoint_id'], ['checkpoints.id'],
                            name=op.f('fk_verification_reports_candidate_checkpoint_id_checkpoints')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_verification_reports_job_id_jobs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_verification_reports')),
    sa.UniqueConstraint('job_id', 'candidate_checkpoint_id',
                        name=op.f('uq_verification_reports_job_id_candidate_checkpoint_id'))
    )
    op.create_index(op.f('ix_verification_reports_job_id'), TABLE, ['job_id'], unique=False)
    _append_only_triggers_create()


def _append_only_triggers_create() -> None:
    """The same refusal of UPDATE, DELETE (and TRUNCATE) as 0001 gives the two chains."""
    dialect = op.get_bind().dialect.name
    if dialect == 'postgresql':
        op.execute(f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
                   "FOR EACH ROW EXECUTE FUNCTION reject_append_only_change()")
        op.execute(f"CREATE TRIGGER {TABLE}_no_truncate BEFORE TRUNCATE ON {TABLE} "
                   "FOR EACH STATEMENT EXECUTE FUNCTION reject_append_only_change()")
    elif dialect == 'sqlite':
        for event in ('UPDATE', 'DELETE'):
            op.execute(
                f"CREATE TRIGGER {TABLE}_no_{event.lower()} BEFORE {event} ON {TABLE} "
                f"BEGIN SELECT RAISE(ABORT, '{event} on {TABLE}: the table is append-only'); END"
            )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == 'postgresql':
        op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE}")
        op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_truncate ON {TABLE}")
    elif dialect == 'sqlite':
        for event in ('update', 'delete'):
            op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_{event}")
    op.drop_index(op.f('ix_verification_reports_job_id'), table_name=TABLE)
    op.drop_table(TABLE)
    with op.batch_alter_table('recipients') as batch_op:
        batch_op.drop_column('secret_ad_version')
    with op.batch_alter_table('erasure_requests') as batch_op:
        batch_op.drop_column('subject_ad_version')
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.drop_column('claim_token')
