"""`manage.py chain_heads_check [--file PATH]`: compare the database with the signed
chain heads exported off it (default: CHAIN_HEAD_EXPORT_DIR/chain-heads.jsonl; pass
the copy kept off this host).  Exit 0 all match, 1 a problem, 2 an unreadable file."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deletion.domain import audit_cli


class Command(BaseCommand):
    help = "Check every exported, signed chain head (and audit seal) against the database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--file", type=Path, metavar="PATH",
                            help="an exported chain-heads.jsonl (default: the export folder's)")

    def handle(self, *args: Any, **options: Any) -> None:
        cfg = dataclasses.replace(settings.CONFIG, database_url=settings.DOMAIN_DATABASE_URL)
        status = audit_cli.chain_heads_check_command(cfg=cfg, out=self.stdout, path=options.get("file"))
        if status != 0:
            raise CommandError("chain heads check failed", returncode=status)
