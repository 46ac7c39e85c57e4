"""`make migrate`: the domain tables (alembic) and Django's own tables, one database."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from deletion.domain.migrate import upgrade


class Command(BaseCommand):
    help = "Apply the alembic (domain) migrations, then Django's, on DATABASE_URL."

    def handle(self, *args: Any, **options: Any) -> None:
        url = settings.DOMAIN_DATABASE_URL
        self.stdout.write("Applying domain migrations (alembic upgrade head)…")
        upgrade(url)
        self.stdout.write("Applying Django migrations…")
        call_command("migrate", interactive=False, verbosity=options.get("verbosity", 1))
        self.stdout.write(self.style.SUCCESS("Database is up to date."))
