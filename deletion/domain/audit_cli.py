"""``audit_chain verify [--full] | seal`` and ``chain_heads_check [--file PATH]``, without Django.

Like ``certificate_cli``: settings and an output stream come in as arguments, so the
``manage.py`` commands (deletion/web) wrap them in a few lines and tests call them
directly.  Each returns the exit status: 0 all well, 1 a problem found, 2 a file or
key the command needs is missing (the message names it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from deletion.domain import config as settings
from deletion.domain.chain_heads import HEADS_FILE, chain_heads_check
from deletion.domain.db import make_engine, session_scope
from deletion.domain.seals import SealCheck, SealKeys, audit_seal, audit_seals_verify
from deletion.domain.signing import keyring_from_config


def _describe(check: SealCheck, out: TextIO) -> None:
    sealed = (f"sealed through seq {check.sealed_seq} (seal {check.seal_id}, "
              f"{check.sealed_at:%Y-%m-%d %H:%M:%S} UTC)" if check.seal_id else "no seal yet")
    out.write(f"audit chain: head at seq {check.head_seq}, {sealed}, {check.unsealed} events "
              f"unsealed, {check.checked} events recomputed\n")
    if not check.keyed:
        out.write("seal HMACs not checked: this process has no AUDIT_SEAL_KEY\n")
    for warning in check.warnings:
        out.write(f"warning: {warning}\n")
    for problem in check.problems:
        out.write(f"BROKEN: {problem}\n")


def audit_chain_verify(*, cfg: settings.Config, out: TextIO, full: bool = False) -> int:
    """Incremental from the last seal; ``full`` walks every event and checks every seal."""
    keys = SealKeys.from_config(cfg)
    engine = make_engine(cfg.database_url)
    try:
        with session_scope(engine) as session:
            check = audit_seals_verify(session, keys=keys, full=full)
    finally:
        engine.dispose()
    _describe(check, out)
    out.write("audit chain OK\n" if check.ok else "audit chain BROKEN\n")
    return 0 if check.ok else 1


def audit_chain_seal(*, cfg: settings.Config, out: TextIO) -> int:
    """Verify from the last seal and seal the chain up to its head (the key's holder only)."""
    keys = SealKeys.for_sealer(cfg)
    engine = make_engine(cfg.database_url)
    try:
        with session_scope(engine) as session:
            outcome = audit_seal(session, keys=keys)
    finally:
        engine.dispose()
    _describe(outcome.check, out)
    if outcome.seal is not None:
        out.write(f"sealed seq {outcome.seal.sealed_seq} as seal {outcome.seal.id} "
                  f"(key {outcome.seal.key_id})\n")
    return 0 if outcome.check.ok else 1


def chain_heads_check_command(*, cfg: settings.Config, out: TextIO, path: Path | None = None) -> int:
    """Compare the database with every signed head exported to ``path`` (default: the
    export folder's file)."""
    path = path or cfg.chain_head_export_dir / HEADS_FILE
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        out.write(f"{path}: cannot read the exported chain heads ({exc.strerror})\n")
        return 2
    engine = make_engine(cfg.database_url)
    try:
        with handle, session_scope(engine) as session:
            verdict = chain_heads_check(session, lines=handle, keyring=keyring_from_config(cfg))
    finally:
        engine.dispose()
    for problem in verdict.problems:
        out.write(f"BROKEN: {problem}\n")
    out.write(f"chain heads: {verdict.records} exported records, {verdict.checked} heads and seals "
              f"compared with the database: {'OK' if verdict.ok else 'BROKEN'}\n")
    return 0 if verdict.ok else 1
