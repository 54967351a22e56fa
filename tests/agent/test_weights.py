"""What the agent declares of the weights it runs (``agent.weights``;
docs/protocol-notes.md 2026-12-07): the sha256 and quantization of the file its
engine loaded, computed once per file (cached by path, size and modification
time), an Ollama blob's digest from its name, sent in every heartbeat."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from agent.engines.scripted import ScriptedEngine
from agent.weights import file_weights, ollama_blob_sha256, weights_or_none
from modeldata.entry import Weights
from modeldata.reference import smollm2_gguf_path

MODEL = "smollm2-135m-instruct"


def tiny_gguf(path: Path, *, file_type: int = 7, seed: int = 0) -> Path:
    """A small GGUF file: its ``general.file_type`` (7: Q8_0) and one tensor."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_file_type(file_type)
    writer.add_tensor(
        "w", np.random.default_rng(seed).standard_normal(64).astype(np.float32)
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_it_reads_a_files_digest_once_and_caches_it(tmp_path):
    model = tiny_gguf(tmp_path / "model.gguf")
    cache = tmp_path / "cache" / "weights.json"
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert file_weights(model, cache=cache) == Weights(digest, "Q8_0")
    # what the cache says is believed while the file's size and time are the same
    data = json.loads(cache.read_text())
    data["files"][str(model.resolve())]["sha256"] = "c" * 64
    cache.write_text(json.dumps(data))
    assert file_weights(model, cache=cache).sha256 == "c" * 64
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert file_weights(model, cache=cache).sha256 == digest, "changed: read again"


def test_a_cache_it_cannot_read_is_ignored(tmp_path):
    model = tiny_gguf(tmp_path / "model.gguf")
    cache = tmp_path / "weights.json"
    cache.write_text("{not json")
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert file_weights(model, cache=cache).sha256 == digest
    assert json.loads(cache.read_text())["format"] == 1, "rewritten whole"


def test_without_a_readable_file_it_declares_no_weights(tmp_path):
    text = tmp_path / "model.gguf"
    text.write_text("not a model")
    assert weights_or_none(text, cache=tmp_path / "c.json") is None
    assert weights_or_none(tmp_path / "missing.gguf", cache=tmp_path / "c.json") is None
    assert weights_or_none(None) is None


def test_an_ollama_blobs_digest_is_its_name(tmp_path):
    """Ollama names a blob by its sha256 (it checks it when it pulls): the
    agent takes it from the name and reads only the quantization."""
    digest = "ab" * 32
    assert ollama_blob_sha256(f"/root/.ollama/models/blobs/sha256-{digest}") == digest
    assert ollama_blob_sha256("/models/llama.gguf") is None
    blob = tiny_gguf(tmp_path / f"sha256-{digest}", file_type=2)
    assert file_weights(blob, cache=tmp_path / "c.json", sha256=digest) == Weights(
        digest, "Q4_0"
    )


@pytest.mark.asyncio
async def test_the_heartbeat_declares_the_weights_of_each_loaded_model(
    coordinator, agent_start
) -> None:
    weights = {MODEL: {"sha256": "12" * 32, "quantization": "Q4_1"}}
    await agent_start(coordinator, script={"weights": weights})
    heartbeat = await coordinator.heartbeat()
    assert heartbeat["devices"][0]["weights"] == weights


@pytest.mark.asyncio
async def test_an_engine_that_cannot_tell_declares_none(
    coordinator, agent_start
) -> None:
    await agent_start(coordinator, script={"weights": {}})
    heartbeat = await coordinator.heartbeat()
    assert heartbeat["devices"][0]["loaded_models"] == [MODEL]
    assert heartbeat["devices"][0]["weights"] == {}


@pytest.mark.asyncio
async def test_the_scripted_engine_plays_the_reference_models_file(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    engine = ScriptedEngine()
    await engine.load()
    path = smollm2_gguf_path()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert engine.weights_loaded == {MODEL: Weights(digest, "Q4_1")}
    assert (tmp_path / "ballast-agent" / "weights.json").exists()
