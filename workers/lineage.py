"""Which checkpoints a model may be rolled back to.

A rollback must never bring an erased subject back: the only admissible
targets are surviving checkpoints that embody every certificate of every
completed erasure of the model (`checkpoint_certificates`).  With linear
promotion that is the serving checkpoint alone until a new erasure lands; the
selector states the rule so that a rollback screen or command cannot get it
wrong.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.models import Certificate, Checkpoint, CheckpointCertificate, Job, Model
from deletion.domain.states import CheckpointStatus


def rollback_targets(session: Session, *, model_name: str) -> list[Checkpoint]:
    model = session.scalars(select(Model).where(Model.name == model_name)).one()
    required = set(session.scalars(
        select(Certificate.id).join(Job, Job.id == Certificate.job_id)
        .where(Job.model_id == model.id, Job.stage == "done")
    ))
    targets = []
    for checkpoint in session.scalars(select(Checkpoint).where(
            Checkpoint.model_id == model.id,
            Checkpoint.status.in_((CheckpointStatus.SERVING, CheckpointStatus.RETIRED)))
            .order_by(Checkpoint.version)):
        embodied = set(session.scalars(select(CheckpointCertificate.certificate_id).where(
            CheckpointCertificate.checkpoint_id == checkpoint.id)))
        if required <= embodied:
            targets.append(checkpoint)
    return targets
