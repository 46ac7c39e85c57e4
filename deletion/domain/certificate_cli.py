"""``certificates verify | export ID --out DIR | rotate-key``, without Django.

The functions take their settings and an output stream as arguments, so that
``manage.py certificates`` (deletion/web) wraps them in a few lines and tests
call them directly.  Each returns the process exit status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from deletion.domain import config as settings
from deletion.domain.certificates import certificate_export, certificate_verify_chain
from deletion.domain.db import make_engine, session_scope
from deletion.domain.errors import DomainError
from deletion.domain.signing import keyring_from_config, signing_key_rotate


def certificates_verify(*, cfg: settings.Config, out: TextIO) -> int:
    """Walk the whole chain; 0 when every row verifies, 1 naming the first bad one."""
    engine = make_engine(cfg.database_url)
    try:
        with session_scope(engine) as session:
            verdict = certificate_verify_chain(session, keyring_from_config(cfg))
    finally:
        engine.dispose()
    if verdict.ok:
        out.write(f"certificate chain OK: {verdict.checked} certificates verified\n")
        return 0
    out.write(
        f"certificate chain BROKEN at seq {verdict.first_bad_seq}: {verdict.reason} "
        f"({verdict.checked} certificates before it verified)\n"
    )
    return 1


def certificates_export(*, cfg: settings.Config, certificate_id: str, out_dir: Path,
                        out: TextIO) -> int:
    """Write one certificate and its public key for offline checking."""
    engine = make_engine(cfg.database_url)
    try:
        with session_scope(engine) as session:
            paths = certificate_export(session, certificate_id=certificate_id,
                                       out_dir=out_dir, keyring=keyring_from_config(cfg))
    except DomainError as exc:
        out.write(f"export failed: {exc}\n")
        return 1
    finally:
        engine.dispose()
    for path in paths:
        out.write(f"wrote {path}\n")
    out.write("check it offline with the recipe in docs/certificates.md\n")
    return 0


def certificates_rotate_key(*, cfg: settings.Config, out: TextIO) -> int:
    """New active signing key; old public keys stay in the ring.  Run on the signer's host."""
    signer = signing_key_rotate(key_file=cfg.signing_key_file,
                                keyring_dir=cfg.signing_keyring_dir)
    out.write(f"active signing key is now {signer.key_id}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="certificates", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("verify", help="verify every hash and signature of the chain")
    export = commands.add_parser("export", help="write a certificate and its public key")
    export.add_argument("certificate_id", metavar="ID")
    export.add_argument("--out", required=True, type=Path, metavar="DIR")
    commands.add_parser("rotate-key", help="replace the signing key, keep the old public key")
    return parser


def run(args: argparse.Namespace, *, cfg: settings.Config, out: TextIO) -> int:
    """Dispatch parsed arguments (shared with the Django management command)."""
    if args.command == "verify":
        return certificates_verify(cfg=cfg, out=out)
    if args.command == "export":
        return certificates_export(cfg=cfg, certificate_id=args.certificate_id,
                                   out_dir=args.out, out=out)
    return certificates_rotate_key(cfg=cfg, out=out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args, cfg=settings.load(), out=sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main())
