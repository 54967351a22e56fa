"""Load the worked values of ``shared/vectors`` (DESIGN.md says tests reproduce them)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def shared_dir() -> Path:
    """``shared/`` beside the checkout (or ``BALLAST_SHARED_DIR``)."""
    env = os.environ.get("BALLAST_SHARED_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared"


def vectors(name: str) -> dict:
    """The parsed ``shared/vectors/<name>.json``."""
    return json.loads((shared_dir() / "vectors" / f"{name}.json").read_text())
