"""`python -m unlearning`: see unlearning/cli.py."""

from __future__ import annotations

import sys

from unlearning.cli import main

sys.exit(main())
