"""corpus sources: the control corpus registered with a corpus, and what registration read
(shard formats, items that fit no record shape)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 10:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | Sequence[str] | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('corpora') as batch:
        batch.add_column(sa.Column('control_path', sa.Text(), nullable=True))
        batch.add_column(sa.Column('control_manifest_digest', sa.String(length=64), nullable=True))
        batch.add_column(sa.Column('control_record_count', sa.Integer(), nullable=True))
    with op.batch_alter_table('corpus_versions') as batch:
        batch.add_column(sa.Column('formats', sa.String(length=200), nullable=True))
        batch.add_column(sa.Column('skipped_count', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('corpus_versions') as batch:
        batch.drop_column('skipped_count')
        batch.drop_column('formats')
    with op.batch_alter_table('corpora') as batch:
        batch.drop_column('control_record_count')
        batch.drop_column('control_manifest_digest')
        batch.drop_column('control_path')
