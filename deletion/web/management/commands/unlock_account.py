"""Release a sign-in lock-out before its cool-off ends (audited)."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from deletion.web.access import lockout_release


class Command(BaseCommand):
    help = "Release the sign-in lock-out of USERNAME now; the release is audited."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        removed = lockout_release(username=options["username"], actor="system:cli")
        self.stdout.write("released" if removed else "that account is not locked")
