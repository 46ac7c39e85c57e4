"""the officer's case: user ids for four-eyes, short batch windows, model owners,
resolutions of failed erasures, editable reply-letter templates

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | Sequence[str] | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('erasure_requests') as batch:
        batch.add_column(sa.Column('submitted_by_id', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('reviewed_by_id', sa.Integer(), nullable=True))
    with op.batch_alter_table('models') as batch:
        batch.add_column(sa.Column('batch_window_minutes', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('owner_email', sa.String(length=254), nullable=True))
        batch.add_column(sa.Column('owner_webhook_url', sa.Text(), nullable=True))

    op.create_table('request_resolutions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('request_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('method', sa.String(length=32), nullable=True),
    sa.Column('preset', sa.String(length=32), nullable=True),
    sa.Column('reason_code', sa.String(length=48), nullable=True),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('proposed_by', sa.String(length=150), nullable=False),
    sa.Column('proposed_by_id', sa.Integer(), nullable=True),
    sa.Column('proposed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('decided_by', sa.String(length=150), nullable=True),
    sa.Column('decided_by_id', sa.Integer(), nullable=True),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('decision_note', sa.Text(), nullable=True),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_request_resolutions_job_id_jobs')),
    sa.ForeignKeyConstraint(['request_id'], ['erasure_requests.id'], name=op.f('fk_request_resolutions_request_id_erasure_requests')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_request_resolutions'))
    )
    op.create_index(op.f('ix_request_resolutions_request_id'), 'request_resolutions', ['request_id'], unique=False)
    op.create_index(op.f('ix_request_resolutions_status'), 'request_resolutions', ['status'], unique=False)

    op.create_table('letter_templates',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('language', sa.String(length=8), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('subject', sa.String(length=200), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('updated_by', sa.String(length=150), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_letter_templates')),
    sa.UniqueConstraint('language', 'kind', name=op.f('uq_letter_templates_language_kind'))
    )


def downgrade() -> None:
    op.drop_table('letter_templates')
    op.drop_index(op.f('ix_request_resolutions_status'), table_name='request_resolutions')
    op.drop_index(op.f('ix_request_resolutions_request_id'), table_name='request_resolutions')
    op.drop_table('request_resolutions')
    with op.batch_alter_table('models') as batch:
        batch.drop_column('owner_webhook_url')
        batch.drop_column('owner_email')
        batch.drop_column('batch_window_minutes')
    with op.batch_alter_table('erasure_requests') as batch:
        batch.drop_column('reviewed_by_id')
        batch.drop_column('submitted_by_id')
