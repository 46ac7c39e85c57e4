"""Run one stage of one job in this process and die at a chosen point, as a worker that
is SIGKILLed there would: `os._exit(137)`, so no `finally`, no rollback, no clean-up of
any kind runs.  Used by test_working_files.py.

    python -m tests.reliability.kill_driver --database URL --checkpoints DIR --broker URL \\
        --job ID --stage STAGE --point MODULE:FUNCTION:before|after|partial [--fail-verification]

`partial` (for `workers.workfiles:_remove_tree`) deletes one file of the folder, then dies.
Exit status 137 means the point was reached; 3 that the stage ended without reaching it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from pathlib import Path
from typing import Any

KILLED = 137


def _arm(point: str) -> None:
    module_name, function, when = point.rsplit(":", 2)
    module = importlib.import_module(module_name)
    original = getattr(module, function)

    def killer(*args: Any, **kwargs: Any) -> Any:
        if when == "before":
            os._exit(KILLED)
        if when == "partial":
            folder = Path(args[0])
            victim = next((p for p in sorted(folder.rglob("*")) if p.is_file()), None)
            if victim is not None:
                victim.unlink()
            os._exit(KILLED)
        result = original(*args, **kwargs)
        os._exit(KILLED)
        return result  # never reached

    setattr(module, function, killer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", required=True)
    parser.add_argument("--checkpoints", type=Path, required=True)
    parser.add_argument("--broker", required=True)
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--point", required=True)
    parser.add_argument("--fail-verification", action="store_true")
    args = parser.parse_args(argv)

    from deletion.domain.config import current
    from tests.stage_fixtures import fake_erase, fake_verify, run_stage
    from workers import runtime, stages, workfiles

    settings = dataclasses.replace(current(), checkpoint_dir=args.checkpoints)
    workfiles.config = lambda: settings  # type: ignore[assignment]
    runtime.use_database(args.database, broker_url=args.broker)
    stages._erase = fake_erase  # type: ignore[assignment]
    stages._verify = fake_verify(passed=not args.fail_verification)  # type: ignore[assignment]
    _arm(args.point)
    run_stage(stages.STAGES[args.stage], args.job, name=args.stage)
    return 3


if __name__ == "__main__":
    sys.exit(main())
