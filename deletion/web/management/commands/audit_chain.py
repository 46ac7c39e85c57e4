"""`manage.py audit_chain verify [--full] | seal`: a thin wrapper over
deletion.domain.audit_cli, on the database Django is configured with.

`verify` checks from the last seal (the full walk only with --full); `seal` needs the
seal key, so run it where the sealing worker runs (beat does it every 5 minutes)."""
from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deletion.domain import audit_cli


class Command(BaseCommand):
    help = "Verify the audit chain against its keyed seals, or seal it up to its head."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True)
        verify = commands.add_parser("verify", help="check the chain from its last seal")
        verify.add_argument("--full", action="store_true",
                            help="walk every event from seq 1 and check every seal")
        commands.add_parser("seal", help="verify from the last seal and seal the chain head")

    def handle(self, *args: Any, **options: Any) -> None:
        cfg = dataclasses.replace(settings.CONFIG, database_url=settings.DOMAIN_DATABASE_URL)
        if options["command"] == "verify":
            status = audit_cli.audit_chain_verify(cfg=cfg, out=self.stdout, full=options["full"])
        else:
            status = audit_cli.audit_chain_seal(cfg=cfg, out=self.stdout)
        if status != 0:
            raise CommandError("audit chain check failed", returncode=status)
