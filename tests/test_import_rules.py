"""The layers import one way (ARCHITECTURE.md section 2); this test keeps it so.

It walks the syntax tree of every module, including imports inside function bodies,
so a lazy ``import torch`` in a view is caught as surely as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RULES = {
    "deletion/domain": ("django", "celery", "torch", "transformers", "unlearning", "workers",
                        "deletion.web", "ninja"),
    "deletion/web": ("torch", "transformers", "unlearning", "workers"),
    "unlearning": ("django", "celery", "sqlalchemy", "alembic", "deletion", "workers"),
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(RULES))
def test_the_layer_imports_nothing_it_must_not(package: str) -> None:
    assert (ROOT / package).is_dir()
    assert violations(package, RULES[package]) == []


def test_the_checker_catches_a_lazy_import(tmp_path: Path) -> None:
    module = tmp_path / "view.py"
    module.write_text("def view():\n    import torch.nn\n    from celery import shared_task\n")
    assert imported_modules(module) >= {"torch.nn", "celery"}
