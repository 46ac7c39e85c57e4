"""Registering a training corpus and its control corpus: read them, then record them.

    python -m workers.corpora register --name NAME --corpus PATH [--control PATH]

Both are read whole once (`unlearning.corpus.inspect_corpus`, streaming: any supported
format, a file or a directory of shards) before anything is written: an unreadable one
is refused with one line naming the file and the reason (`ValidationError` on the field
`corpus_path` or `control_path`; exit 2 from the command line) and nothing is registered.
Items that fit no record shape are counted in the registry and the audit trail.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.errors import ValidationError
from deletion.domain.models import CorpusVersion

log = logging.getLogger(__name__)

REGISTRAR_ACTOR = "system:registrar"


def corpus_read(path: str | Path, *, field: str) -> Any:
    """`CorpusInfo` of a corpus, or `ValidationError(field, one line)` when it cannot be read."""
    from unlearning.corpus import CorpusError, inspect_corpus
    from unlearning.corpus.convert import convert_hint

    try:
        return inspect_corpus(path)
    except CorpusError as exc:
        message = str(exc).splitlines()[0]
        raise ValidationError(field, message + convert_hint(message)) from exc


def corpus_register_files(session: Session, *, actor: str, name: str, path: str | Path,
                          control_path: str | Path | None = None) -> CorpusVersion:
    """Read the corpus (and the control corpus), then register both in one transaction."""
    info = corpus_read(path, field="corpus_path")
    control = corpus_read(control_path, field="control_path") if control_path is not None else None
    if info.report.skipped_count:
        log.warning("corpus %s: %s items fit no record shape (first: %s)", name, info.report.skipped_count,
                    info.report.skipped[0].line() if info.report.skipped else "-")
    return registry.corpus_register_sources(
        session, actor=actor, name=name, path=str(path), manifest_digest=info.manifest_digest,
        record_count=info.records, formats=",".join(info.formats), skipped_count=info.report.skipped_count,
        control_path=None if control is None else str(control_path),
        control_manifest_digest=None if control is None else control.manifest_digest,
        control_record_count=None if control is None else control.records,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.corpora", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    register = commands.add_parser("register", help="register a training corpus (and its control corpus)")
    register.add_argument("--name", required=True)
    register.add_argument("--corpus", required=True, type=Path, help="a corpus file or directory")
    register.add_argument("--control", type=Path, default=None,
                          help="records about people the model never saw (any corpus format)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from deletion.domain.db import session_scope
    from workers.runtime import engine

    try:
        with session_scope(engine()) as session:
            version = corpus_register_files(session, actor=REGISTRAR_ACTOR, name=args.name, path=args.corpus,
                                            control_path=args.control)
            line = f"corpus {args.name} v{version.version}: {version.record_count} records\n"
    except ValidationError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
