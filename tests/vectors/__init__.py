"""The worked values the tests reproduce (DESIGN.md), kept in the project.

``score.json``, ``quarantine.json`` and ``receipt.json`` are copies of
``shared/vectors/``; ``test_vectors_shared.py`` checks they still equal it
wherever that folder sits beside the repository.
"""

from __future__ import annotations

import json
from pathlib import Path

VECTORS_DIR = Path(__file__).resolve().parent
"""This folder: one ``<name>.json`` per set of worked values."""


def vector_names() -> list[str]:
    """The names of the project's vector files, sorted: ``["quarantine", ...]``."""
    return sorted(path.stem for path in VECTORS_DIR.glob("*.json"))


def vectors(name: str) -> dict:
    """The parsed ``tests/vectors/<name>.json``.

    Raises ``FileNotFoundError`` for a name the project has no file for.
    """
    return json.loads((VECTORS_DIR / f"{name}.json").read_text(encoding="utf-8"))
