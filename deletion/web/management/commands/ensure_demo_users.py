"""Demo accounts for the embedded run: one per role.  Idempotent: the first run
generates passwords and keeps them in var/demo-credentials.json (0600); later runs
print the same ones."""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser

from deletion.web.roles import ADMIN, AUDITOR, OFFICER, REVIEWER

DEMO_USERS = (("demo-officer", OFFICER), ("demo-reviewer", REVIEWER),
              ("demo-auditor", AUDITOR), ("demo-admin", ADMIN))


def _load(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _save(path: Path, creds: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(creds, fh, indent=2)


class Command(BaseCommand):
    help = "Create the demo officer, reviewer, auditor and admin accounts and print their passwords."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--file", default=str(Path(settings.BASE_DIR) / "var" / "demo-credentials.json"))
        parser.add_argument("--json", action="store_true", help="print the credentials as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["file"])
        creds = _load(path)
        users = get_user_model().objects
        for username, role in DEMO_USERS:
            user = users.filter(username=username).first()
            if user is None:
                user = users.create_user(username=username)
            password = creds.get(username) or secrets.token_urlsafe(12)
            if not user.check_password(password):
                user.set_password(password)
                user.save(update_fields=["password"])
            user.groups.set([Group.objects.get_or_create(name=role)[0]])
            creds[username] = password
        _save(path, creds)
        if options["json"]:
            self.stdout.write(json.dumps(creds))
            return
        self.stdout.write("Demo accounts (role: username / password):")
        for username, role in DEMO_USERS:
            self.stdout.write(f"  {role:<9} {username} / {creds[username]}")
