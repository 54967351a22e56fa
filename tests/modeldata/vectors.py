"""llama.cpp's own tokenizer test vectors, fetched once into ``var/vocab-vectors/``.

They ship in llama-cpp-python's source distribution, under
``vendor/llama.cpp/models/``: ``ggml-vocab-NAME.gguf`` (a vocabulary, no
weights), with ``.gguf.inp`` (texts separated by a line ``__ggml_vocab_test__``)
and ``.gguf.out`` (each text's token ids, one line each) for most of them. The
version is the one ``requirements.txt`` pins, downloaded with pip (about 75 MB,
once; the unpacked vocabularies take about 80 MB).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "var" / "vocab-vectors"
TEMPLATES = VECTORS / "templates"
"""Real models' chat templates, as llama.cpp's tests keep them
(``vendor/llama.cpp/models/templates/*.jinja``)."""
SEPARATOR = "\n__ggml_vocab_test__\n"
EXTRACTED = 2
"""Raised when what is taken of the archive changes (1: vocabularies; 2: and
chat templates)."""


class VectorsUnavailable(RuntimeError):
    """The source distribution could not be downloaded (no network, no PyPI)."""


def pinned_version() -> str:
    """llama-cpp-python's version in ``requirements.txt``."""
    text = (ROOT / "requirements.txt").read_text()
    match = re.search(r"^llama-cpp-python(?:\[[^\]]*\])?==([^\s#]+)", text, re.M)
    assert match, "requirements.txt pins llama-cpp-python"
    return match.group(1)


def vectors_fetch() -> Path:
    """The folder of ``ggml-vocab-*`` files (and ``templates/``), downloaded
    and unpacked the first time (a ``.complete-VERSION.N`` marker says it is
    whole).

    Raises ``VectorsUnavailable`` when pip cannot download the sdist.
    """
    version = pinned_version()
    marker = VECTORS / f".complete-{version}.{EXTRACTED}"
    if marker.exists():
        return VECTORS
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--no-binary", ":all:", "-d", tmp]
            + [f"llama-cpp-python=={version}"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        archives = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if not archives:
            raise VectorsUnavailable(
                f"pip download llama-cpp-python=={version} failed: {done.stderr[-1000:]}"
            )
        TEMPLATES.mkdir(parents=True, exist_ok=True)
        for old in [*VECTORS.glob("ggml-vocab-*"), *TEMPLATES.glob("*.jinja")]:
            old.unlink()
        with tarfile.open(archives[0]) as archive:
            for member in archive.getmembers():
                name = Path(member.name).name
                if not member.isfile():
                    continue
                if "/vendor/llama.cpp/models/templates/" in member.name:
                    folder = TEMPLATES if name.endswith(".jinja") else None
                elif "/vendor/llama.cpp/models/" in member.name:
                    folder = VECTORS if name.startswith("ggml-vocab-") else None
                else:
                    folder = None
                if folder is not None:
                    source = archive.extractfile(member)
                    assert source is not None
                    (folder / name).write_bytes(source.read())
    marker.touch()
    return VECTORS


def template_read(name: str) -> str:
    """The chat template ``name`` (``Qwen-Qwen2.5-7B-Instruct``) of llama.cpp's
    tests. Raises ``VectorsUnavailable`` as ``vectors_fetch``."""
    return (vectors_fetch() / "templates" / f"{name}.jinja").read_text()


def vectors_read(gguf: Path) -> list[tuple[str, list[int]]]:
    """The (text, token ids) cases of a vocabulary file, as llama.cpp's
    ``test-tokenizer-0`` reads them ([] when it has none)."""
    inp, out = Path(f"{gguf}.inp"), Path(f"{gguf}.out")
    if not inp.exists():
        return []
    raw = inp.read_bytes().decode("utf-8")
    texts: list[str] = []
    position = 0
    while position < len(raw):
        found = raw.find(SEPARATOR, position)
        if found < 0:
            texts.append(raw[position:])
            break
        texts.append(raw[position:found])
        position = found + len(SEPARATOR)
    expected = out.read_text().split("\n")
    return [
        (text, [int(t) for t in expected[i].split()]) for i, text in enumerate(texts)
    ]
