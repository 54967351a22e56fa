"""The weights an engine loaded, as the agent declares them in its heartbeats
(``devices[].weights``, docs/protocol-notes.md 2026-12-07): the sha256 of the
GGUF file and its quantization.

A digest reads the whole file (about 1 s per GB), so it is computed once per
file and kept in the agent's cache (``weights_cache_path``: a JSON file keyed
by the file's absolute path, valid while its size and modification time stay
the same). Ollama names its blobs by their sha256 (``sha256-<hex>``), so a
blob's digest is its name (``ollama_blob_sha256``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path

from modeldata.entry import Weights, weights_read
from modeldata.modelfile import ModelFileError

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
_OLLAMA_BLOB = re.compile(r"sha256[-:]([0-9a-f]{64})")


def weights_cache_path() -> Path:
    """The agent's cache of file digests:
    ``$XDG_CACHE_HOME/ballast-agent/weights.json`` (``~/.cache/…`` by default)."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "ballast-agent" / "weights.json"


def ollama_blob_sha256(path: str | Path) -> str | None:
    """The sha256 an Ollama blob's file name says (``…/blobs/sha256-<hex>``),
    or None for another name."""
    match = _OLLAMA_BLOB.fullmatch(Path(path).name)
    return match.group(1) if match else None


def file_weights(
    path: str | Path, *, cache: Path | None = None, sha256: str | None = None
) -> Weights:
    """The ``Weights`` (sha256, quantization) of the GGUF file at ``path``,
    from the cache when its size and modification time are the ones cached,
    else read (``modeldata.entry.weights_read``; ``sha256`` when the digest is
    known, an Ollama blob's) and cached.

    ``cache``: the cache file (default ``weights_cache_path()``); one that
    cannot be read or written is logged and left alone. Raises ``OSError``
    when ``path`` cannot be read, ``ModelFileError`` when it is not GGUF.
    """
    cache = cache or weights_cache_path()
    file = Path(path).resolve()
    stat = file.stat()
    key = str(file)
    entries = _cache_load(cache)
    entry = entries.get(key)
    if (
        isinstance(entry, dict)
        and entry.get("size") == stat.st_size
        and entry.get("mtime_ns") == stat.st_mtime_ns
        and isinstance(entry.get("sha256"), str)
        and isinstance(entry.get("quantization"), str)
    ):
        return Weights(sha256=entry["sha256"], quantization=entry["quantization"])
    log.info("computing the sha256 of %s (once per file)", file)
    weights = weights_read(file, sha256=sha256)
    entries[key] = {
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": weights.sha256,
        "quantization": weights.quantization,
    }
    _cache_save(cache, entries)
    return weights


def weights_or_none(path: str | Path | None, **opts) -> Weights | None:
    """``file_weights(path, **opts)``, or None (logged) when there is no path
    or the file cannot be read as GGUF: the model is then declared without
    weights (the coordinator gives it no work of a model whose entry pins them)."""
    if path is None:
        return None
    try:
        return file_weights(path, **opts)
    except (OSError, ModelFileError) as exc:
        log.warning("cannot tell which weights %s holds: %s", path, exc)
        return None


def _cache_load(cache: Path) -> dict:
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring the weights cache %s: %s", cache, exc)
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}


def _cache_save(cache: Path, entries: dict) -> None:
    """Write the cache whole, atomically (a temporary file renamed over it):
    agents sharing it never read half a file; the last writer wins."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=cache.parent, prefix=".weights-", delete=False, encoding="utf-8"
        ) as handle:
            json.dump({"format": CACHE_FORMAT, "files": entries}, handle)
        os.replace(handle.name, cache)
    except OSError as exc:
        log.warning("cannot write the weights cache %s: %s", cache, exc)
