"""The import contracts of ``pyproject.toml`` ([tool.importlinter]) hold.

They keep the parts of DESIGN.md apart: the agent imports nothing from the
coordinator (nor Django); the coordinator imports nothing of the agent nor
``llama_cpp`` (it tokenizes and renders from the catalog's data with
``modeldata``; ``refengine`` alone runs a model); ``trust`` sits over ``jobs``,
over ``hosts``, over ``billing``, over ``catalog``, and a part imports only the
parts below it (so ``jobs`` never imports ``trust``: it tells it what it must
through ``jobs.hooks``; ``hosts`` and ``billing`` never import ``jobs``, and
``catalog`` imports none of them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LINT_IMPORTS = (
    "import sys; from importlinter.cli import lint_imports_command;"
    " sys.exit(lint_imports_command())"
)
"""``lint-imports`` run by this interpreter (the virtualenv's, wherever it is)."""


def test_the_import_contracts_are_kept() -> None:
    """``lint-imports`` exits 0; on a broken contract the failure shows its report
    (each forbidden import with its module and line)."""
    result = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
