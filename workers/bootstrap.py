"""Bootstrap the demo: corpus and model `demo`, version 1, serving.

    python -m workers.bootstrap --preset demo     # make run (trains on CPU the first time)
    python -m workers.bootstrap --preset tiny     # tests

The expensive artefacts (the generated corpus and the trained base model) are
built once into an assets folder and reused by every later bootstrap; the
registry gets its own copies, because checkpoint files are destroyed after
an erasure's grace window and the cache must survive that.  A database that
already has the model is left alone, so bootstrapping is idempotent.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from deletion.domain.db import session_scope
from deletion.domain.models import Model

log = logging.getLogger(__name__)

DEMO_MODEL = "demo"
DEMO_CORPUS = "demo"
BOOTSTRAP_ACTOR = "system:bootstrap"
# People trained on, per preset (the engine's `train_base` presets are sized for these).
PEOPLE = {"tiny": 24, "demo": 200}


@dataclass(frozen=True)
class DemoAssets:
    corpus_dir: Path
    model_dir: Path


@dataclass(frozen=True)
class DemoBootstrap:
    model_name: str
    checkpoint_dir: Path
    corpus_dir: Path
    created: bool


def demo_assets_ensure(*, preset: str, assets_root: Path, progress: Any = None,
                       threads: int | None = None) -> DemoAssets:
    """Generate the corpus and train the base model for `preset`, unless already there."""
    from unlearning.demo.corpus import write_demo_corpus
    from unlearning.demo.train_base import train_base

    corpus_dir = assets_root / preset / "corpus"
    model_dir = assets_root / preset / "base"
    if not (corpus_dir / "manifest.json").is_file():
        partial = corpus_dir.with_name("corpus.partial")
        shutil.rmtree(partial, ignore_errors=True)
        write_demo_corpus(partial, people=PEOPLE[preset], seed=0)
        shutil.rmtree(corpus_dir, ignore_errors=True)
        partial.rename(corpus_dir)
    if not (model_dir / "config.json").is_file():
        log.info("training the %s base model on CPU (first start only)", preset)
        partial = model_dir.with_name("base.partial")
        shutil.rmtree(partial, ignore_errors=True)
        result = train_base(corpus_dir / "corpus.jsonl", partial, preset=preset, seed=0,
                            progress=progress, threads=threads)
        log.info("base model: accuracy %.3f after %s steps in %.0f s", result.accuracy,
                 result.steps, result.seconds)
        shutil.rmtree(model_dir, ignore_errors=True)
        partial.rename(model_dir)
    return DemoAssets(corpus_dir=corpus_dir, model_dir=model_dir)


def bootstrap_demo(*, preset: str = "demo", assets_root: Path | None = None,
                   progress: Any = None, threads: int | None = None) -> DemoBootstrap:
    """Register corpus `demo` and model `demo` v1 (serving) in DATABASE_URL, once."""
    from deletion.domain import registry
    from workers.runtime import config, engine

    cfg = config()
    corpus_dir = cfg.corpus_dir / DEMO_CORPUS
    checkpoint_dir = cfg.checkpoint_dir / DEMO_MODEL / "v1"
    with session_scope(engine()) as session:
        if session.scalar(select(Model.id).where(Model.name == DEMO_MODEL)) is not None:
            return DemoBootstrap(DEMO_MODEL, checkpoint_dir, corpus_dir, created=False)

    assets = demo_assets_ensure(preset=preset, assets_root=assets_root or cfg.var_dir / "demo-assets",
                                progress=progress, threads=threads)
    _copy_fresh(assets.corpus_dir, corpus_dir)
    _copy_fresh(assets.model_dir, checkpoint_dir)
    from workers.corpora import corpus_register_files

    # The demo's control people as records (`control.jsonl` is the people format).
    control = corpus_dir / "control_records.jsonl"
    with session_scope(engine()) as session:
        corpus_register_files(session, actor=BOOTSTRAP_ACTOR, name=DEMO_CORPUS,
                              path=corpus_dir / "corpus.jsonl",
                              control_path=control if control.is_file() else None)
        registry.model_register(session, actor=BOOTSTRAP_ACTOR, name=DEMO_MODEL,
                                description=f"demo model ({preset} preset) on synthetic people",
                                corpus_name=DEMO_CORPUS)
        registry.checkpoint_register(session, actor=BOOTSTRAP_ACTOR, model_name=DEMO_MODEL,
                                     directory=str(checkpoint_dir),
                                     digest=registry.checkpoint_digest(checkpoint_dir),
                                     serving=True)
    log.info("registered model %s v1 (serving) and corpus %s", DEMO_MODEL, DEMO_CORPUS)
    return DemoBootstrap(DEMO_MODEL, checkpoint_dir, corpus_dir, created=True)


def _copy_fresh(source: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.bootstrap", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PEOPLE), default="demo")
    parser.add_argument("--assets", type=Path, default=None,
                        help="where trained artefacts are cached (default VAR_DIR/demo-assets)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from unlearning.progress import progress_bar

    with progress_bar(enabled=not args.no_progress) as bar:
        outcome = bootstrap_demo(preset=args.preset, assets_root=args.assets, progress=bar)
    state = "registered" if outcome.created else "already registered"
    sys.stdout.write(f"model {outcome.model_name} v1 {state}; checkpoint {outcome.checkpoint_dir}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
