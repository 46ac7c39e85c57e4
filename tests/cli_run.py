"""Run the engine's CLI in-process, as a user would from a shell, and read what it wrote."""

from __future__ import annotations

import pytest

from unlearning.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`python -m unlearning ARGV...`: (exit code, stdout, stderr); argparse's exits included,
    and what the test printed before the call left out."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse errors
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
