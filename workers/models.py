"""Registering a model of one's own: its trained checkpoint, served, on a registered corpus.

    python -m workers.models register --name NAME --corpus CORPUS --checkpoint DIR [--description TEXT]

The checkpoint directory (a Hugging Face folder: config.json, weights, tokenizer) is
loaded once on CPU before anything is written, exactly as the workers will load it
(no remote code unless its files are inside the folder, no links), so a folder that
would fail in the first erasure is refused now, with one line naming the folder and the
reason (exit 2).  The registry then gets its own copy under CHECKPOINT_DIR/NAME/v1 (an
erasure retires and finally destroys old checkpoints, which must never touch the
engineer's original), and the copy is registered as version 1, serving.  The corpus must
be registered first (`python -m workers.corpora register`), with its control corpus
where there is one.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

from sqlalchemy import select

from deletion.domain import registry
from deletion.domain.errors import DomainError, ValidationError
from deletion.domain.models import Model

log = logging.getLogger(__name__)

REGISTRAR_ACTOR = "system:registrar"


def checkpoint_read(directory: Path) -> str:
    """One line about a loadable checkpoint, or `ValidationError("checkpoint", reason)`."""
    from unlearning.modeling import ModelLoadError, load_model

    if not directory.is_dir():
        raise ValidationError("checkpoint", f"not a directory: {directory}")
    try:
        model, _ = load_model(directory, device="cpu")
    except ModelLoadError as exc:
        raise ValidationError("checkpoint", str(exc).splitlines()[0]) from exc
    parameters = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__}, {parameters / 1e6:.2f}M parameters"


def model_register_files(*, name: str, corpus: str, checkpoint: Path, description: str = "") -> Path:
    """Check, copy and register `checkpoint` as version 1 (serving) of a new model `name`."""
    from deletion.domain.db import session_scope
    from workers.runtime import config, engine

    if not name.strip() or "/" in name or name.startswith("."):
        raise ValidationError("name", f"not a usable model name: {name!r}")
    with session_scope(engine()) as session:
        if session.scalar(select(Model.id).where(Model.name == name)) is not None:
            raise ValidationError("name", f"model {name} is already registered")
        registry.corpus_get(session, name=corpus)  # NotFound before any copying
    summary = checkpoint_read(checkpoint)
    target = config().checkpoint_dir / name / "v1"
    partial = target.with_name("v1.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(checkpoint, partial, symlinks=True)
    try:
        digest = registry.checkpoint_digest(partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        with session_scope(engine()) as session:
            registry.model_register(session, actor=REGISTRAR_ACTOR, name=name,
                                    description=description or summary, corpus_name=corpus)
            registry.checkpoint_register(session, actor=REGISTRAR_ACTOR, model_name=name,
                                         directory=str(target), digest=digest, serving=True)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        raise
    log.info("registered model %s v1 (serving): %s", name, summary)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    register = commands.add_parser("register", help="register a trained model, served, on a registered corpus")
    register.add_argument("--name", required=True)
    register.add_argument("--corpus", required=True, help="the registered corpus it was trained on")
    register.add_argument("--checkpoint", required=True, type=Path, help="a Hugging Face model folder")
    register.add_argument("--description", default="")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        target = model_register_files(name=args.name, corpus=args.corpus, checkpoint=args.checkpoint,
                                      description=args.description)
    except DomainError as exc:  # a bad name, an unknown corpus, a folder that does not load
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write(f"model {args.name} v1 registered (serving); checkpoint {target}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
