"""The ``llamacpp-server`` engine against a real llama.cpp server:
llama-cpp-python's own (``python -m llama_cpp.server``) with SmolLM2, started by
the test on 127.0.0.1 and stopped after it. At temperature 0 it answers as the
in-process engine does, and a continuation cut mid-word goes on exactly."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from agent.engines.base import GenerationRequest, GenerationResult
from agent.engines.llamacpp import smollm2_gguf_path
from agent.engines.openai_server import LlamaCppServerEngine

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp.server") is None
    or importlib.util.find_spec("sse_starlette") is None,
    reason="llama-cpp-python's server is not installed (llama-cpp-python[server])",
)

MODEL = "smollm2-135m-instruct"
HAIKU = [{"role": "user", "content": "Write a haiku about autumn."}]


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


async def _run(engine: Any, **kw: Any) -> tuple[str, GenerationResult]:
    result = GenerationResult()
    request = GenerationRequest(model=MODEL, **kw)
    text = "".join([piece async for piece in engine.stream(request, result)])
    return text, result


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "content", ["What is 2+2?", "Write a haiku about autumn."]
)
async def test_it_answers_as_the_in_process_engine(llama_server, llama_engine, content):
    engine = LlamaCppServerEngine(base_url=llama_server, model=MODEL)
    await engine.load()
    assert engine.loaded_models() == [MODEL]
    request = {
        "messages": [{"role": "user", "content": content}],
        "params": {"temperature": 0, "max_tokens": 40},
    }
    text, result = await _run(engine, **request)
    expected, reference = await _run(llama_engine, **request)
    assert text == expected
    assert result.finish_reason == reference.finish_reason
    assert result.completion_tokens == reference.completion_tokens  # one per event
    await engine.close()


@pytest.mark.asyncio
async def test_a_continuation_cut_mid_word_goes_on_exactly(llama_server):
    """Healed: the server goes on from the start of the cut word and says it
    again; only the rest is passed on, so prefix + continuation is the
    uninterrupted answer. (Sent as is, the cut word is tokenized as the model
    would not have written it and the answer goes astray: agent/README.md.)"""
    engine = LlamaCppServerEngine(base_url=llama_server, model=MODEL)
    await engine.load()
    params = {"temperature": 0, "max_tokens": 40}
    full, _ = await _run(engine, messages=HAIKU, params=params)
    for cut in (21, 39, 48):  # inside "year", "autumn's", "beauty"
        assert full[cut - 1].isalpha() and full[cut].isalpha()
        rest, result = await _run(
            engine, messages=HAIKU, params=params, continue_from=full[:cut]
        )
        assert (full[:cut] + rest).startswith(full), (cut, rest)
        assert 0 < result.completion_tokens <= len(rest)
    await engine.close()
