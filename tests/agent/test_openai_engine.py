"""The OpenAI-server engine against an in-test server (httpx.MockTransport)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from agent.engines.base import (
    GenerationError,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
)
from agent.engines.openai_server import OpenAIServerEngine

pytestmark = []

MODEL = "smollm2-135m-instruct"


class FakeServer:
    """A llama.cpp-server-like API: /v1/models, /props (optional), /v1/completions."""

    def __init__(
        self,
        *,
        models: list[str],
        props: dict[str, Any] | None = None,
        status: int = 200,
    ):
        self.models = models
        self.props = props
        self.status = status
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": m} for m in self.models]})
        if request.url.path == "/props" and self.props is not None:
            return httpx.Response(200, json=self.props)
        if request.url.path == "/v1/completions":
            self.bodies.append(json.loads(request.content))
            if self.status != 200:
                return httpx.Response(self.status, text="model crashed")
            events = [
                {"choices": [{"text": "ea is", "finish_reason": None}]},
                {"choices": [{"text": "", "finish_reason": None}]},
                {"choices": [{"text": " wide.", "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 3}},
            ]
            body = (
                "".join(f"data: {json.dumps(e)}\n\n" for e in events)
                + "data: [DONE]\n\n"
            )
            return httpx.Response(
                200, text=body, headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(404)


def engine_for(server: FakeServer, **kwargs: Any) -> OpenAIServerEngine:
    return OpenAIServerEngine(
        base_url="http://llm.test",
        model=MODEL,
        transport=httpx.MockTransport(server),
        **kwargs,
    )


@pytest.mark.asyncio
async def test_it_sends_the_rendered_chat_plus_the_prefix_as_a_raw_completion() -> None:
    server = FakeServer(models=["smollm2:135m"])
    engine = engine_for(server)
    await engine.load()
    assert engine.loaded_models() == [MODEL]
    request = GenerationRequest(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe the sea."}],
        params={"max_tokens": 10, "temperature": 0, "seed": 3, "stop": "\n\n"},
        continue_from="The s",
    )
    result = GenerationResult()
    pieces = [piece async for piece in engine.stream(request, result)]
    assert pieces == ["ea is", " wide."]
    assert (result.finish_reason, result.prompt_tokens, result.completion_tokens) == (
        "stop",
        30,
        3,
    )
    body = server.bodies[0]
    assert body["model"] == "smollm2:135m"  # the server's only model
    assert body["prompt"].endswith(
        "<|im_start|>user\nDescribe the sea.<|im_end|>\n<|im_start|>assistant\nThe s"
    )
    assert body["stream"] is True and body["max_tokens"] == 10 and body["seed"] == 3
    assert body["stop"] == ["\n\n"]
    await engine.close()


@pytest.mark.asyncio
async def test_it_prefers_the_template_the_server_exposes() -> None:
    server = FakeServer(
        models=[MODEL],
        props={
            "chat_template": "{% for m in messages %}[{{ m.content }}]{% endfor %}>",
            "build_info": "b1234",
        },
    )
    engine = engine_for(server)
    await engine.load()
    assert engine.version == "llama.cpp-server b1234"
    request = GenerationRequest(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], continue_from="Wel"
    )
    [piece async for piece in engine.stream(request, GenerationResult())]
    assert server.bodies[0]["prompt"] == "[hi]>Wel"
    await engine.close()


@pytest.mark.asyncio
async def test_a_server_error_is_a_generation_error() -> None:
    engine = engine_for(FakeServer(models=[MODEL], status=500))
    await engine.load()
    with pytest.raises(GenerationError, match="500"):
        async for _ in engine.stream(
            GenerationRequest(model=MODEL, prompt="x"), GenerationResult()
        ):
            pass
    await engine.close()


@pytest.mark.asyncio
async def test_load_fails_when_the_model_is_not_served_or_the_server_is_down() -> None:
    engine = engine_for(FakeServer(models=["a", "b"]))
    with pytest.raises(ModelLoadError, match="--openai-model"):
        await engine.load()
    assert engine.loaded_models() == []
    await engine.close()

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    engine = OpenAIServerEngine(
        base_url="http://llm.test", transport=httpx.MockTransport(down)
    )
    with pytest.raises(ModelLoadError, match="cannot list models"):
        await engine.load()
    await engine.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "seed, sent", [(2**40 + 7, 7), (-1, 2**32 - 1), (2**32 - 1, 2**32 - 1)]
)
async def test_a_64_bit_seed_reaches_the_server_as_llama_cpps_32_bits(seed, sent):
    """A renter may send any 64-bit seed (OpenAI's); llama.cpp's are 32 bits,
    so it is reduced, never sent as a number the server could refuse (which
    would fail the attempt and count against the host)."""
    server = FakeServer(models=["smollm2:135m"])
    engine = engine_for(server)
    await engine.load()
    request = GenerationRequest(
        model=MODEL, prompt="Hi", params={"max_tokens": 4, "seed": seed}
    )
    [piece async for piece in engine.stream(request, GenerationResult())]
    assert server.bodies[0]["seed"] == sent
    await engine.close()
