"""The Ollama engine against exchanges taken from Ollama's API documentation.

Ollama cannot run here (no binary, and the tests install nothing), so its
answers are replayed by a documented-exchange double (``docserver.DocServer``,
a real HTTP server on 127.0.0.1) from ``exchanges/ollama.jsonl``: the shapes of
``docs/api.md`` (list local models, show model information, load a model,
generate streamed and raw) and of its page on errors. What is checked is what
the engine sends and how it reads what Ollama answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.engines.base import (
    GenerationError,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
)
from agent.engines.llamacpp import smollm2_gguf_path
from agent.engines.ollama import OllamaEngine

from .docserver import DocServer, exchanges

pytestmark = []

MODEL = "smollm2-135m-instruct"
SEA = [{"role": "user", "content": "Describe the sea."}]
TURN = "<|im_start|>user\nDescribe the sea.<|im_end|>\n<|im_start|>assistant\n"
LOAD = ("tags", "version", "show", "load")


async def run(engine: OllamaEngine, **kwargs: Any) -> tuple[list[str], GenerationResult]:
    result = GenerationResult()
    request = GenerationRequest(model=MODEL, **kwargs)
    return [piece async for piece in engine.stream(request, result)], result


@pytest.mark.asyncio
async def test_load_finds_the_model_reads_its_template_and_loads_it() -> None:
    with DocServer(exchanges("ollama", *LOAD)) as ollama:
        engine = OllamaEngine(base_url=ollama.url, server_model="smollm2:135m")
        await engine.load()
        assert engine.loaded_models() == [MODEL]
        assert engine.version == "ollama 0.5.1"
        assert [path for _, path, _ in ollama.requests] == [
            "/api/tags",
            "/api/version",
            "/api/show",
            "/api/generate",
        ]
        assert ollama.bodies("/api/show") == [{"model": "smollm2:135m"}]
        # "Load a model": the model alone, no prompt
        assert ollama.bodies("/api/generate") == [
            {"model": "smollm2:135m", "stream": False}
        ]
        await engine.close()


@pytest.mark.asyncio
async def test_the_chat_template_comes_from_the_gguf_blob_ollama_names(tmp_path) -> None:
    """``/api/show``'s modelfile says ``FROM <blob path>``: the agent runs on
    Ollama's machine and reads the model's own chat template from that file."""
    blob = tmp_path / "sha256-f535f83ec568d040f88ddc04a199fa6da90923bbb41d4dcaed02caa924d6ef57"
    blob.symlink_to(smollm2_gguf_path())
    show = exchanges("ollama", "show")[0]["body"]
    modelfile = show["modelfile"].replace(
        "/root/.ollama/models/blobs/" + blob.name, str(blob)
    )
    played = exchanges(
        "ollama", "tags", "version", "show", "load", "generate_stream",
        show={"modelfile": modelfile},
    )  # fmt: skip
    with DocServer(played) as ollama:
        engine = OllamaEngine(
            base_url=ollama.url,
            server_model="smollm2:135m",
            chat_template_gguf=Path("/nonexistent.gguf"),  # not needed: the blob is
        )
        await engine.load()
        await run(engine, messages=SEA)
        assert ollama.bodies("/api/generate")[-1]["prompt"].endswith(TURN)
        await engine.close()


@pytest.mark.asyncio
async def test_a_name_without_a_tag_is_ollamas_latest() -> None:
    with DocServer(exchanges("ollama", "tags_latest", "version", "show", "load")) as ollama:
        engine = OllamaEngine(base_url=ollama.url, server_model="smollm2")
        await engine.load()
        assert engine.server_model == "smollm2:latest"
        await engine.close()


@pytest.mark.asyncio
async def test_it_generates_raw_with_the_reference_sampler() -> None:
    with DocServer(exchanges("ollama", *LOAD, "generate_stream")) as ollama:
        engine = OllamaEngine(base_url=ollama.url, server_model="smollm2:135m")
        await engine.load()
        pieces, result = await run(
            engine,
            messages=SEA,
            params={"max_tokens": 16, "temperature": 0, "seed": 2**40 + 7, "stop": "\n\n"},
        )
        assert pieces == ["The", " sea", " is", " vast", "."]
        assert (result.finish_reason, result.prompt_tokens, result.completion_tokens) == (
            "stop",
            31,
            5,
        )
        body = ollama.bodies("/api/generate")[-1]
        assert body["model"] == "smollm2:135m"
        assert body["raw"] is True and body["stream"] is True
        assert body["prompt"].startswith("<|im_start|>system\n")  # SmolLM2's own
        assert body["prompt"].endswith(TURN)
        assert body["options"] == {
            "temperature": 0.0,
            "top_p": 1.0,
            "seed": 7,  # 32 bits, as llama.cpp takes it
            "top_k": 40,
            "min_p": 0.05,
            "repeat_penalty": 1.0,  # Ollama's default is 1.1
            "num_predict": 16,
            "stop": ["\n\n"],
        }
        await engine.close()


@pytest.mark.asyncio
async def test_done_reason_length_is_a_length_finish() -> None:
    with DocServer(exchanges("ollama", *LOAD, "generate_length")) as ollama:
        engine = OllamaEngine(base_url=ollama.url, server_model="smollm2:135m")
        await engine.load()
        pieces, result = await run(engine, prompt="Describe the sea.", params={"max_tokens": 3})
        assert "".join(pieces) == "The sea is"
        assert (result.finish_reason, result.completion_tokens) == ("length", 3)
        assert ollama.bodies("/api/generate")[-1]["prompt"] == "Describe the sea."
        await engine.close()


@pytest.mark.asyncio
async def test_a_continuation_goes_on_from_the_exact_prefix_healed() -> None:
    """Prefix "The s": the raw prompt ends "The", Ollama says " sea" again,
    and only "ea" and what follows reach the renter."""
    with DocServer(exchanges("ollama", *LOAD, "generate_healed")) as ollama:
        engine = OllamaEngine(base_url=ollama.url, server_model="smollm2:135m")
        await engine.load()
        pieces, result = await run(engine, messages=SEA, continue_from="The s")
        assert "The s" + "".join(pieces) == "The sea is vast."
        assert result.completion_tokens == 4
        assert ollama.bodies("/api/generate")[-1]["prompt"].endswith(TURN + "The")
        await engine.close()


@pytest.mark.asyncio
async def test_an_error_mid_stream_is_a_generation_error() -> None:
    """Ollama's errors page: an error once streaming began is a line
    ``{"error": …}`` with the status still 200."""
    with DocServer(exchanges("ollama", *LOAD, "generate_error_midstream")) as ollama:
        engine = OllamaEngine(base_url=ollama.url, server_model="smollm2:135m")
        await engine.load()
        got: list[str] = []
        with pytest.raises(GenerationError, match="error was encountered"):
            async for piece in engine.stream(
                GenerationRequest(model=MODEL, messages=SEA), GenerationResult()
            ):
                got.append(piece)
        assert got == ["The", " sea"]
        await engine.close()


@pytest.mark.asyncio
async def test_load_fails_with_ollamas_error_or_without_the_model() -> None:
    played = exchanges("ollama", "tags", "version", "show", "load_missing")
    with DocServer(played) as ollama:
        engine = OllamaEngine(base_url=ollama.url, server_model="smollm2:135m")
        with pytest.raises(ModelLoadError, match="404.*not found"):
            await engine.load()
        assert engine.loaded_models() == []
        await engine.close()
    with DocServer(exchanges("ollama", "tags")) as ollama:
        engine = OllamaEngine(base_url=ollama.url)  # two models, none named
        with pytest.raises(ModelLoadError, match="--engine-model"):
            await engine.load()
        await engine.close()
