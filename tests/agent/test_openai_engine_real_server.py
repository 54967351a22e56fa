"""The ``openai`` engine against a real local OpenAI-compatible server:
llama-cpp-python's own server (``python -m llama_cpp.server``) with SmolLM2,
started by the test on 127.0.0.1 and stopped after it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest

from agent.engines.base import GenerationRequest, GenerationResult
from agent.engines.llamacpp import smollm2_gguf_path
from agent.engines.openai_server import OpenAIServerEngine

pytestmark = []

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(tmp_path_factory.mktemp("llama-server") / "server.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(smollm2_gguf_path()),
            "--model_alias",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:  # a separate process: poll its readiness, bounded
            assert process.poll() is None, "llama_cpp.server exited"
            try:
                if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama_cpp.server did not start"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


async def _run(engine, **kw) -> tuple[str, GenerationResult]:
    result = GenerationResult()
    request = GenerationRequest(model=MODEL, **kw)
    text = "".join([piece async for piece in engine.stream(request, result)])
    return text, result


@pytest.mark.asyncio
async def test_it_answers_through_llama_cpp_server(llama_server):
    engine = OpenAIServerEngine(base_url=llama_server, model=MODEL)
    await engine.load()
    assert MODEL in engine.loaded_models()
    text, result = await _run(
        engine,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        params={"temperature": 0, "max_tokens": 32},
    )
    assert "4" in text
    assert 0 < result.completion_tokens <= 32


@pytest.mark.asyncio
async def test_it_continues_from_an_exact_prefix_cut_mid_word(llama_server):
    engine = OpenAIServerEngine(base_url=llama_server, model=MODEL)
    await engine.load()
    messages = [{"role": "user", "content": "Describe the sea in two sentences."}]
    full, _ = await _run(
        engine, messages=messages, params={"temperature": 0, "max_tokens": 48}
    )
    cut = next(
        i for i in range(20, len(full)) if full[i - 1].isalpha() and full[i].isalpha()
    )
    prefix = full[:cut]  # ends inside a word
    rest, result = await _run(
        engine,
        messages=messages,
        params={"temperature": 0, "max_tokens": 40},
        continue_from=prefix,
    )
    assert rest, "the server continued the answer"
    assert result.completion_tokens > 0
    assert not rest.lstrip().startswith(full[:12]), (
        "it goes on from the prefix, not from the start"
    )
