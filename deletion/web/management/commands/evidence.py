"""``manage.py evidence verify FILE``: check an evidence pack offline.

Exit 0 when every check holds, 1 when one fails, 2 when the file cannot be read.
Nothing here touches the database: the pack carries its own keys and links.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from deletion.domain.evidence import evidence_verify


class Command(BaseCommand):
    help = "Verify an evidence pack (ZIP) offline: evidence verify FILE"

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True)
        verify = commands.add_parser("verify", help="check every hash, link and signature of a pack")
        verify.add_argument("file", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            self.stderr.write(f"file: cannot read {path}: {exc.strerror}")
            sys.exit(2)
        report = evidence_verify(data)
        for line in report.lines:
            self.stdout.write(line)
        if report.lines and report.lines[0].startswith("FAIL  not an evidence pack"):
            sys.exit(2)
        self.stdout.write("evidence pack VERIFIES" if report.ok else "evidence pack does NOT verify")
        if not report.ok:
            sys.exit(1)
