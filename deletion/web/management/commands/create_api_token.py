"""Issue an API token for a user; the plaintext is shown once and never stored."""
from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deletion.web.models import api_token_create
from deletion.web.roles import user_roles


class Command(BaseCommand):
    help = "Create an API token for USER and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label to recognise the token by")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no such user: {options['username']}")
        if not user_roles(user):
            raise CommandError("the user has no role; add them to officer, reviewer, auditor or admin first")
        _, plaintext = api_token_create(user=user, name=options["name"])
        self.stdout.write(plaintext)
