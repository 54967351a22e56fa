"""The project's worked vectors equal ``shared/vectors/`` where that folder exists.

``shared/`` is the folder beside the repository (``<repo>/../shared``), or
``BALLAST_SHARED_DIR``; a clone without it skips these tests, with the path looked
at as the reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.vectors import VECTORS_DIR, vector_names, vectors

REPO = Path(__file__).resolve().parents[2]


def _shared_vectors_dir() -> Path:
    """``<repo>/../shared/vectors`` (``$BALLAST_SHARED_DIR/vectors`` if set)."""
    shared = os.environ.get("BALLAST_SHARED_DIR")
    return (Path(shared) if shared else REPO.parent / "shared") / "vectors"


SHARED = _shared_vectors_dir()

pytestmark = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"no shared vectors beside the repository ({SHARED})"
)


def test_the_project_keeps_every_shared_vector_file() -> None:
    """Every ``shared/vectors/*.json`` has its copy in ``tests/vectors/``."""
    shared_names = sorted(path.stem for path in SHARED.glob("*.json"))
    assert shared_names, f"{SHARED} holds no vector file"
    missing = sorted(set(shared_names) - set(vector_names()))
    assert not missing, f"copy {missing} from {SHARED} into {VECTORS_DIR}"


@pytest.mark.parametrize("name", vector_names())
def test_the_project_copy_equals_the_shared_vectors(name: str) -> None:
    """``tests/vectors/<name>.json`` parses to the same value as the shared file."""
    shared_file = SHARED / f"{name}.json"
    assert shared_file.is_file(), f"{shared_file} is gone: is the copy still right?"
    shared = json.loads(shared_file.read_text(encoding="utf-8"))
    assert vectors(name) == shared, (
        f"{VECTORS_DIR / name}.json differs from {shared_file}"
    )
