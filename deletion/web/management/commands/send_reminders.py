"""Send the deadline reminders that are due (beat runs this every 10 minutes)."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from deletion.web.reminders import reminders_send


class Command(BaseCommand):
    help = "Send deadline reminders (7 and 2 days before, and on the day) by e-mail and webhook."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--now", help="ISO time to act as now (for a dry look at a date)")

    def handle(self, *args: Any, **options: Any) -> None:
        now = None
        if options["now"]:
            try:
                now = datetime.fromisoformat(options["now"])
            except ValueError:
                raise CommandError("--now: expected an ISO date-time such as 2026-12-24T09:00+00:00") from None
            if now.tzinfo is None:
                raise CommandError("--now: give a time zone (+00:00)")
        run = reminders_send(now=now)
        self.stdout.write(f"{run.sent} reminder(s) sent ({run.emails} e-mail(s), {run.webhooks} webhook event(s))")
