"""Container health checks that need more than one command line (docker-compose.yml).

    python -m workers.health beat SCHEDULE_FILE [--max-age SECONDS]

Beat is healthy while it ticks: its persistent scheduler writes the schedule file
(shelve: the name itself or the name plus a suffix, by dbm backend) at least every
three minutes (Celery's `sync_every`), so a file older than `--max-age` (10 minutes)
means beat is stuck or gone.  Web is checked on `/healthz` (which asks the database)
and workers with `celery inspect ping`, both directly in the compose file.

Nothing here loads the settings: beat holds no keys, and neither does its check.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

BEAT_MAX_AGE_S = 600.0


def schedule_age_s(schedule: Path, *, now: float | None = None) -> float | None:
    """Seconds since beat last wrote its schedule file (any dbm suffix), or None if absent."""
    candidates = [p for p in schedule.parent.glob(f"{schedule.name}*") if p.is_file()]
    if not candidates:
        return None
    newest = max(p.stat().st_mtime for p in candidates)
    return (time.time() if now is None else now) - newest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.health", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="process", required=True)
    beat = sub.add_parser("beat", help="healthy while beat keeps writing its schedule file")
    beat.add_argument("schedule", type=Path)
    beat.add_argument("--max-age", type=float, default=BEAT_MAX_AGE_S)
    args = parser.parse_args(argv)
    age = schedule_age_s(args.schedule)
    if age is None:
        sys.stderr.write(f"beat: no schedule file {args.schedule}*\n")
        return 1
    if age > args.max_age:
        sys.stderr.write(f"beat: schedule file last written {age:.0f} s ago\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
