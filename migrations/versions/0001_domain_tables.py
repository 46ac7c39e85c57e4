"""domain tables, the two deferred foreign keys of the registry cycle, and the
append-only triggers on audit_events and certificates

Revision ID: 0001
Revises:
Create Date: 2026-11-29 18:22:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0001'
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('audit_events',
    sa.Column('seq', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=150), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('object_type', sa.String(length=32), nullable=False),
    sa.Column('object_ref', sa.String(length=64), nullable=False),
    sa.Column('details', sa.Text(), nullable=False),
    sa.Column('prev_hash', sa.String(length=64), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_audit_events')),
    sa.UniqueConstraint('hash', name=op.f('uq_audit_events_hash'))
    )
    op.create_index(op.f('ix_audit_events_action'), 'audit_events', ['action'], unique=False)
    op.create_index('ix_audit_events_object', 'audit_events', ['object_type', 'object_ref'], unique=False)

    op.create_table('chain_heads',
    sa.Column('name', sa.String(length=32), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_chain_heads'))
    )
    op.create_table('corpora',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_corpora')),
    sa.UniqueConstraint('name', name=op.f('uq_corpora_name'))
    )
    op.create_table('outbox',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('task_name', sa.String(length=200), nullable=False),
    sa.Column('args', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('sent_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_outbox'))
    )
    op.create_index(op.f('ix_outbox_sent_at'), 'outbox', ['sent_at'], unique=False)

    op.create_table('reference_counters',
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('last', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('prefix', name=op.f('pk_reference_counters'))
    )
    op.create_table('corpus_versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('corpus_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('manifest_digest', sa.String(length=64), nullable=False),
    sa.Column('record_count', sa.Integer(), nullable=True),
    sa.Column('tombstoned_count', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['corpus_id'], ['corpora.id'], name=op.f('fk_corpus_versions_corpus_id_corpora')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_corpus_versions')),
    sa.UniqueConstraint('corpus_id', 'version', name=op.f('uq_corpus_versions_corpus_id_version'))
    )
    op.create_index(op.f('ix_corpus_versions_corpus_id'), 'corpus_versions', ['corpus_id'], unique=False)

    op.create_table('models',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('corpus_id', sa.Integer(), nullable=True),
    sa.Column('serving_checkpoint_id', sa.Integer(), nullable=True),
    sa.Column('batch_window_hours', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['corpus_id'], ['corpora.id'], name=op.f('fk_models_corpus_id_corpora')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_models')),
    sa.UniqueConstraint('name', name=op.f('uq_models_name'))
    )
    op.create_table('checkpoints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('parent_id', sa.Integer(), nullable=True),
    sa.Column('directory', sa.Text(), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('promoted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('retired_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('destroy_after', sa.DateTime(timezone=True), nullable=True),
    sa.Column('destroyed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_checkpoints_model_id_models')),
    sa.ForeignKeyConstraint(['parent_id'], ['checkpoints.id'], name=op.f('fk_checkpoints_parent_id_checkpoints')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoints')),
    sa.UniqueConstraint('model_id', 'version', name=op.f('uq_checkpoints_model_id_version'))
    )
    op.create_index(op.f('ix_checkpoints_model_id'), 'checkpoints', ['model_id'], unique=False)
    op.create_index(op.f('ix_checkpoints_status'), 'checkpoints', ['status'], unique=False)

    op.create_table('erasure_requests',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('reference', sa.String(length=20), nullable=False),
    sa.Column('subject_ciphertext', sa.LargeBinary(), nullable=True),
    sa.Column('subject_key_id', sa.String(length=32), nullable=False),
    sa.Column('subject_hmac', sa.String(length=64), nullable=False),
    sa.Column('blind_key_id', sa.String(length=32), nullable=False),
    sa.Column('ground', sa.String(length=40), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('due_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('extension_months', sa.Integer(), nullable=True),
    sa.Column('extension_reason', sa.Text(), nullable=True),
    sa.Column('extended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('priority', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('submitted_by', sa.String(length=150), nullable=False),
    sa.Column('reviewed_by', sa.String(length=150), nullable=True),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('reason_code', sa.String(length=48), nullable=True),
    sa.Column('decision_note', sa.Text(), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('purged_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_erasure_requests_model_id_models')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_erasure_requests')),
    sa.UniqueConstraint('reference', name=op.f('uq_erasure_requests_reference'))
    )
    op.create_index(op.f('ix_erasure_requests_model_id'), 'erasure_requests', ['model_id'], unique=False)
    op.create_index(op.f('ix_erasure_requests_status'), 'erasure_requests', ['status'], unique=False)
    op.create_index(op.f('ix_erasure_requests_subject_hmac'), 'erasure_requests', ['subject_hmac'], unique=False)

    op.create_table('recipients',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('model_id', sa.Integer(), nullable=True),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('endpoint_url', sa.Text(), nullable=True),
    sa.Column('secret_ciphertext', sa.LargeBinary(), nullable=True),
    sa.Column('secret_key_id', sa.String(length=32), nullable=True),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_recipients_model_id_models')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_recipients')),
    sa.UniqueConstraint('name', name=op.f('uq_recipients_name'))
    )
    op.create_table('deadline_alerts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('request_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('sent_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['request_id'], ['erasure_requests.id'], name=op.f('fk_deadline_alerts_request_id_erasure_requests')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_deadline_alerts')),
    sa.UniqueConstraint('request_id', 'kind', name=op.f('uq_deadline_alerts_request_id_kind'))
    )
    op.create_table('jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('method', sa.String(length=32), nullable=False),
    sa.Column('hparams', sa.JSON(), nullable=False),
    sa.Column('base_checkpoint_id', sa.Integer(), nullable=False),
    sa.Column('candidate_checkpoint_id', sa.Integer(), nullable=True),
    sa.Column('corpus_version_id', sa.Integer(), nullable=True),
    sa.Column('stage', sa.String(length=24), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('progress_stage', sa.String(length=32), nullable=True),
    sa.Column('progress_step', sa.Integer(), nullable=True),
    sa.Column('progress_total', sa.Integer(), nullable=True),
    sa.Column('progress_eta_seconds', sa.Float(), nullable=True),
    sa.Column('sets', sa.JSON(), nullable=True),
    sa.Column('work_dir', sa.Text(), nullable=True),
    sa.Column('timings', sa.JSON(), nullable=False),
    sa.Column('verification_round', sa.Integer(), nullable=False),
    sa.Column('escalated', sa.Boolean(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('worker', sa.String(length=200), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_by', sa.String(length=150), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('dead_lettered_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['base_checkpoint_id'], ['checkpoints.id'], name=op.f('fk_jobs_base_checkpoint_id_checkpoints')),
    sa.ForeignKeyConstraint(['candidate_checkpoint_id'], ['checkpoints.id'], name=op.f('fk_jobs_candidate_checkpoint_id_checkpoints')),
    sa.ForeignKeyConstraint(['corpus_version_id'], ['corpus_versions.id'], name=op.f('fk_jobs_corpus_version_id_corpus_versions')),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_jobs_model_id_models')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    op.create_index(op.f('ix_jobs_model_id'), 'jobs', ['model_id'], unique=False)
    op.create_index(op.f('ix_jobs_stage'), 'jobs', ['stage'], unique=False)
    op.create_index('uq_jobs_one_active_per_model', 'jobs', ['model_id'], unique=True, postgresql_where=sa.text("stage NOT IN ('done', 'rejected') AND dead_lettered_at IS NULL"), sqlite_where=sa.text("stage NOT IN ('done', 'rejected') AND dead_lettered_at IS NULL"))

    op.create_table('notifications',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('request_id', sa.Integer(), nullable=False),
    sa.Column('recipient_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('sent_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('response_code', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['recipient_id'], ['recipients.id'], name=op.f('fk_notifications_recipient_id_recipients')),
    sa.ForeignKeyConstraint(['request_id'], ['erasure_requests.id'], name=op.f('fk_notifications_request_id_erasure_requests')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notifications')),
    sa.UniqueConstraint('request_id', 'recipient_id', name=op.f('uq_notifications_request_id_recipient_id'))
    )
    op.create_index(op.f('ix_notifications_request_id'), 'notifications', ['request_id'], unique=False)

    op.create_table('subject_index',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('request_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('hmac', sa.String(length=64), nullable=False),
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['request_id'], ['erasure_requests.id'], name=op.f('fk_subject_index_request_id_erasure_requests'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_subject_index'))
    )
    op.create_index(op.f('ix_subject_index_hmac'), 'subject_index', ['hmac'], unique=False)
    op.create_index(op.f('ix_subject_index_request_id'), 'subject_index', ['request_id'], unique=False)

    op.create_table('certificates',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('certificate_id', sa.String(length=64), nullable=False),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.Column('payload_hash', sa.String(length=64), nullable=False),
    sa.Column('prev_hash', sa.String(length=64), nullable=False),
    sa.Column('signature', sa.Text(), nullable=False),
    sa.Column('key_id', sa.String(length=128), nullable=False),
    sa.Column('signed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_certificates_job_id_jobs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_certificates')),
    sa.UniqueConstraint('certificate_id', name=op.f('uq_certificates_certificate_id')),
    sa.UniqueConstraint('seq', name=op.f('uq_certificates_seq'))
    )
    op.create_index(op.f('ix_certificates_job_id'), 'certificates', ['job_id'], unique=False)

    op.create_table('corpus_tombstones',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('corpus_id', sa.Integer(), nullable=False),
    sa.Column('record_id', sa.String(length=200), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['corpus_id'], ['corpora.id'], name=op.f('fk_corpus_tombstones_corpus_id_corpora')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_corpus_tombstones_job_id_jobs')),
    sa.ForeignKeyConstraint(['version_id'], ['corpus_versions.id'], name=op.f('fk_corpus_tombstones_version_id_corpus_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_corpus_tombstones')),
    sa.UniqueConstraint('corpus_id', 'record_id', name=op.f('uq_corpus_tombstones_corpus_id_record_id'))
    )
    op.create_index(op.f('ix_corpus_tombstones_corpus_id'), 'corpus_tombstones', ['corpus_id'], unique=False)

    op.create_table('job_requests',
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('request_id', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_requests_job_id_jobs')),
    sa.ForeignKeyConstraint(['request_id'], ['erasure_requests.id'], name=op.f('fk_job_requests_request_id_erasure_requests')),
    sa.PrimaryKeyConstraint('job_id', 'request_id', name=op.f('pk_job_requests'))
    )
    op.create_index(op.f('ix_job_requests_request_id'), 'job_requests', ['request_id'], unique=False)

    op.create_table('verification_results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('round', sa.Integer(), nullable=False),
    sa.Column('metric', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Float(), nullable=True),
    sa.Column('threshold', sa.Float(), nullable=True),
    sa.Column('comparator', sa.String(length=4), nullable=True),
    sa.Column('passed', sa.Boolean(), nullable=True),
    sa.Column('policy_name', sa.String(length=64), nullable=False),
    sa.Column('policy_version', sa.String(length=32), nullable=False),
    sa.Column('details', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_verification_results_job_id_jobs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_verification_results')),
    sa.UniqueConstraint('job_id', 'round', 'metric', name=op.f('uq_verification_results_job_id_round_metric'))
    )
    op.create_index(op.f('ix_verification_results_job_id'), 'verification_results', ['job_id'], unique=False)

    op.create_table('checkpoint_certificates',
    sa.Column('checkpoint_id', sa.Integer(), nullable=False),
    sa.Column('certificate_id', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['certificate_id'], ['certificates.id'], name=op.f('fk_checkpoint_certificates_certificate_id_certificates')),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'], name=op.f('fk_checkpoint_certificates_checkpoint_id_checkpoints')),
    sa.PrimaryKeyConstraint('checkpoint_id', 'certificate_id', name=op.f('pk_checkpoint_certificates'))
    )

    # Foreign keys that close a cycle (models <-> checkpoints, jobs <-> corpus_versions);
    # batch mode rebuilds the (still empty) table on SQLite, which has no ADD CONSTRAINT.
    with op.batch_alter_table('models') as batch_op:
        batch_op.create_foreign_key(
            op.f('fk_models_serving_checkpoint_id_checkpoints'),
            'checkpoints', ['serving_checkpoint_id'], ['id'],
        )
    with op.batch_alter_table('corpus_versions') as batch_op:
        batch_op.create_foreign_key(
            op.f('fk_corpus_versions_job_id_jobs'), 'jobs', ['job_id'], ['id'],
        )
    _append_only_triggers_create()


APPEND_ONLY_TABLES = ('audit_events', 'certificates')


def _append_only_triggers_create() -> None:
    """Refuse UPDATE, DELETE (and on PostgreSQL TRUNCATE) on the hash-chained tables."""
    dialect = op.get_bind().dialect.name
    if dialect == 'postgresql':
        op.execute(
            """
            CREATE FUNCTION reject_append_only_change() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '% on %: the table is append-only', TG_OP, TG_TABLE_NAME
                    USING ERRCODE = 'insufficient_privilege';
            END $$;
            """
        )
        for table in APPEND_ONLY_TABLES:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION reject_append_only_change()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION reject_append_only_change()"
            )
    elif dialect == 'sqlite':
        for table in APPEND_ONLY_TABLES:
            for event in ('UPDATE', 'DELETE'):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{event.lower()} BEFORE {event} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{event} on {table}: the table is append-only'); END"
                )


def _append_only_triggers_drop() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == 'postgresql':
        for table in APPEND_ONLY_TABLES:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
        op.execute("DROP FUNCTION IF EXISTS reject_append_only_change()")
    elif dialect == 'sqlite':
        for table in APPEND_ONLY_TABLES:
            for event in ('update', 'delete'):
                op.execute(f"DROP TRIGGER IF EXISTS {table}_no_{event}")


def downgrade() -> None:
    _append_only_triggers_drop()
    with op.batch_alter_table('corpus_versions') as batch_op:
        batch_op.drop_constraint(op.f('fk_corpus_versions_job_id_jobs'), type_='foreignkey')
    with op.batch_alter_table('models') as batch_op:
        batch_op.drop_constraint(
            op.f('fk_models_serving_checkpoint_id_checkpoints'), type_='foreignkey'
        )
    op.drop_table('checkpoint_certificates')
    op.drop_index(op.f('ix_verification_results_job_id'), table_name='verification_results')

    op.drop_table('verification_results')
    op.drop_index(op.f('ix_job_requests_request_id'), table_name='job_requests')

    op.drop_table('job_requests')
    op.drop_index(op.f('ix_corpus_tombstones_corpus_id'), table_name='corpus_tombstones')

    op.drop_table('corpus_tombstones')
    op.drop_index(op.f('ix_certificates_job_id'), table_name='certificates')

    op.drop_table('certificates')
    op.drop_index(op.f('ix_subject_index_request_id'), table_name='subject_index')
    op.drop_index(op.f('ix_subject_index_hmac'), table_name='subject_index')

    op.drop_table('subject_index')
    op.drop_index(op.f('ix_notifications_request_id'), table_name='notifications')

    op.drop_table('notifications')
    op.drop_index('uq_jobs_one_active_per_model', table_name='jobs', postgresql_where=sa.text("stage NOT IN ('done', 'rejected') AND dead_lettered_at IS NULL"), sqlite_where=sa.text("stage NOT IN ('done', 'rejected') AND dead_lettered_at IS NULL"))
    op.drop_index(op.f('ix_jobs_stage'), table_name='jobs')
    op.drop_index(op.f('ix_jobs_model_id'), table_name='jobs')

    op.drop_table('jobs')
    op.drop_table('deadline_alerts')
    op.drop_table('recipients')
    op.drop_index(op.f('ix_erasure_requests_subject_hmac'), table_name='erasure_requests')
    op.drop_index(op.f('ix_erasure_requests_status'), table_name='erasure_requests')
    op.drop_index(op.f('ix_erasure_requests_model_id'), table_name='erasure_requests')

    op.drop_table('erasure_requests')
    op.drop_index(op.f('ix_checkpoints_status'), table_name='checkpoints')
    op.drop_index(op.f('ix_checkpoints_model_id'), table_name='checkpoints')

    op.drop_table('checkpoints')
    op.drop_table('models')
    op.drop_index(op.f('ix_corpus_versions_corpus_id'), table_name='corpus_versions')

    op.drop_table('corpus_versions')
    op.drop_table('reference_counters')
    op.drop_index(op.f('ix_outbox_sent_at'), table_name='outbox')

    op.drop_table('outbox')
    op.drop_table('corpora')
    op.drop_table('chain_heads')
    op.drop_index('ix_audit_events_object', table_name='audit_events')
    op.drop_index(op.f('ix_audit_events_action'), table_name='audit_events')

    op.drop_table('audit_events')
