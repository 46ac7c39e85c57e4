"""The embedded runtime: everything on one machine, no servers to install.

    python -m workers.embedded run    # make run: migrate, bootstrap, web + worker + beat
    python -m workers.embedded demo   # make demo: one whole erasure, headless

SQLite is the database and kombu's `sqla+sqlite://` transport the broker, with
a real worker process and one beat.  Neither embedded broker redelivers a task
after a crash; the beat's reconciler resumes such jobs from the database.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from workers.processes import (
    PYTHON,
    ProcessGroup,
    beat_command,
    run_step,
    web_command,
    worker_command,
)

if TYPE_CHECKING:
    from workers.walk import Reading, ServingMeter

log = logging.getLogger(__name__)


class _Stop(BaseException):
    """SIGTERM.  Not an Exception, as KeyboardInterrupt is not: the demo's and the walk's
    `except Exception` (a failure reported, the walk going on) must not swallow a stop."""


def _raise_stop(signum: int, _frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def _stop_on_signals() -> None:
    """SIGTERM raises _Stop and SIGINT KeyboardInterrupt, so the children are stopped in order.

    A shell starts background jobs with SIGINT ignored, and Python then never raises
    KeyboardInterrupt: Ctrl-C (or `kill -INT`) must stop the service however it was started.
    """
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def prepare(*, preset: str, assets: str | None = None) -> None:
    """Migrate both schemas and bootstrap the demo model (trained the first time only)."""
    run_step([PYTHON, "manage.py", "migrate_all"])
    run_step([PYTHON, "-m", "workers.bootstrap", "--preset", preset,
              *(["--assets", assets] if assets else [])])


def command_run(args: argparse.Namespace) -> int:
    from deletion.domain.config import current

    config = current()
    prepare(preset=args.preset, assets=args.assets)
    run_step([PYTHON, "manage.py", "ensure_demo_users"])
    logs = config.var_dir / "logs"
    group = ProcessGroup(env=os.environ)
    _stop_on_signals()
    try:
        group.start("worker", worker_command(), log_file=logs / "worker.log")
        group.start("beat", beat_command(schedule_file=config.var_dir / "celerybeat-schedule"),
                    log_file=logs / "beat.log")
        group.start("web", web_command(bind=config.web_bind), log_file=logs / "web.log")
        sys.stdout.write(
            f"\nErasure service running on http://{config.web_bind}/  "
            f"(worker and beat logs under {logs}).  Ctrl-C stops everything.\n"
        )
        sys.stdout.flush()
        while True:
            exited = group.first_exited()
            if exited is not None:
                name, code = exited
                sys.stderr.write(f"{name} exited with status {code}; see {logs / (name + '.log')}\n")
                return 1
            time.sleep(0.5)
    except (KeyboardInterrupt, _Stop):
        sys.stdout.write("\nstopping web, beat and worker...\n")
        return 0
    finally:
        group.stop()


def command_demo(args: argparse.Namespace) -> int:
    from deletion.domain.config import current
    from workers.demo import render_walk, run_demo

    config = current()
    started = time.monotonic()
    try:
        prepare(preset=args.preset, assets=args.assets)
    except RuntimeError as exc:
        sys.stderr.write(f"demo failed while preparing: {exc}\n")
        return 1
    logs = config.var_dir / "logs"
    group = ProcessGroup(env=os.environ)
    _stop_on_signals()
    meter: ServingMeter | None = None
    before: Reading | None = None
    readings: list[Reading] = []
    try:
        if args.requests > 1:  # a walk: the serving model on its fixed sample, before the first request
            from workers import walk

            meter, before = walk.start(args.requests)
            sys.stdout.write(_reading_line("before the first request", before, meter))
            sys.stdout.flush()
        group.start("worker", worker_command(), log_file=logs / "demo-worker.log")
        group.start("beat", beat_command(schedule_file=config.var_dir / "celerybeat-schedule"),
                    log_file=logs / "demo-beat.log")
        outcomes = []
        filed: set[str] = set()  # a walk files each person once, certified or not
        for number in range(args.requests):
            if number:
                sys.stdout.write(f"\nrequest {number + 1} of {args.requests}\n")
            outcomes.append(run_demo(config=config, timeout_s=args.timeout, watch=group.first_exited,
                                     filed=filed))
            sys.stdout.write(outcomes[-1].render())
            if meter is not None:  # the job has ended: nothing else holds the CPU or GPU now
                readings.append(meter.read_or_say_why())
                sys.stdout.write(_reading_line("serving now", readings[-1], meter))
                sys.stdout.flush()
            if group.first_exited() is not None:
                break
    except (KeyboardInterrupt, _Stop):
        sys.stderr.write("demo interrupted\n")
        return 130
    except Exception as exc:  # noqa: BLE001 - the demo's contract: exit 1 with the reason
        log.exception("demo failed")
        sys.stderr.write(f"demo failed: {type(exc).__name__}: {exc}\n")
        return 1
    finally:
        group.stop()
    if args.requests > 1:
        from workers import walk

        sample = meter.sample if meter is not None else None
        rows = [o.walk_row() | walk.row_fields(readings[n] if n < len(readings) else None, before, sample)
                for n, o in enumerate(outcomes)]
        sys.stdout.write(render_walk(rows))
        if sample is not None and (stray := filed - sample.people):
            sys.stdout.write(f"warning: the fixed sample left out the people this walk was to file, but it "
                             f"filed {len(stray)} others (erased meanwhile?): it may hold their questions\n")
        if args.walk_json:
            Path(args.walk_json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    sys.stdout.write(f"wall time {time.monotonic() - started:.1f} s (worker log: {logs / 'demo-worker.log'})\n")
    return 0 if len(outcomes) == args.requests and all(o.ok for o in outcomes) else 1


def _reading_line(when: str, reading: Reading, meter: ServingMeter | None) -> str:
    """One line of the walk's log: a model's accuracy on the walk's fixed sample."""
    if meter is None or reading.accuracy is None:
        return f"retained (fixed sample), {when}: not scored ({reading.error})\n"
    how = "unchanged, not scored again" if reading.cached else f"scored in {reading.seconds:.1f} s"
    return (f"retained (fixed sample of {meter.sample.size} questions), {when}: v{reading.version} "
            f"{reading.accuracy:.3f} ({how})\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, not {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.embedded", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start web, worker and beat on embedded defaults")
    run.add_argument("--preset", default="demo", choices=("tiny", "demo"))
    run.add_argument("--assets", help="folder caching the trained demo model (default VAR_DIR/demo-assets)")
    run.set_defaults(handler=command_run)
    demo = sub.add_parser("demo", help="run one whole erasure headless and print the certificate")
    demo.add_argument("--preset", default="demo", choices=("tiny", "demo"))
    demo.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the certificate")
    demo.add_argument("--assets", help="folder caching the trained demo model (default VAR_DIR/demo-assets)")
    demo.add_argument("--requests", type=_positive, default=1,
                      help="erase this many demo people, one request after another (a walk table at the end)")
    demo.add_argument("--walk-json", help="also write the walk table as JSON to this file")
    demo.set_defaults(handler=command_demo)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
