"""Run in a child process (Django configured by DATABASE_URL): an officer with an API token and
a registered model to file requests against.  Prints one JSON line: token and model name."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "deletion.settings")
    import django

    django.setup()
    from django.contrib.auth.models import Group, User

    from deletion.domain.registry import checkpoint_register, model_register
    from deletion.web.domain_session import domain_session
    from deletion.web.models import api_token_create
    from deletion.web.roles import OFFICER

    user = User.objects.create_user(username=f"bench-officer-{uuid.uuid4().hex[:6]}")
    user.groups.add(Group.objects.get_or_create(name=OFFICER)[0])
    _, token = api_token_create(user=user, name="bench")
    directory = tempfile.mkdtemp(prefix="bench-checkpoint-")
    with open(os.path.join(directory, "model.safetensors"), "wb") as handle:
        handle.write(b"stand-in weights: the API benchmark never loads a model")
    name = "bench-model"
    with domain_session() as session:
        model_register(session, actor="system:bench", name=name, description="API benchmark")
        checkpoint_register(session, actor="system:bench", model_name=name, directory=directory, serving=True)
    sys.stdout.write(json.dumps({"token": token, "model": name}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
