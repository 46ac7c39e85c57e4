"""`manage.py certificates verify | export ID --out DIR | rotate-key`: a thin wrapper
over deletion.domain.certificate_cli, on the database Django is configured with."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deletion.domain import certificate_cli


class Command(BaseCommand):
    help = "Verify the certificate chain, export one certificate, or rotate the signing key."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True)
        commands.add_parser("verify", help="verify every hash and signature of the chain")
        export = commands.add_parser("export", help="write a certificate and its public key")
        export.add_argument("certificate_id", metavar="ID")
        export.add_argument("--out", required=True, type=Path, metavar="DIR")
        commands.add_parser("rotate-key", help="replace the signing key, keep the old public key")

    def handle(self, *args: Any, **options: Any) -> None:
        cfg = dataclasses.replace(settings.CONFIG, database_url=settings.DOMAIN_DATABASE_URL)
        namespace = argparse.Namespace(command=options["command"],
                                       certificate_id=options.get("certificate_id"), out=options.get("out"))
        status = certificate_cli.run(namespace, cfg=cfg, out=self.stdout)
        if status != 0:
            raise CommandError("certificate check failed", returncode=status)
