"""The OpenAI-server engines (``openai``, ``llamacpp-server``) against an in-test
server (httpx.MockTransport): request bodies, healing a continuation, errors.
The real llama.cpp server: ``test_llamacpp_server_engine.py``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agent.engines.base import (
    GenerationError,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
)
from agent.engines.openai_server import LlamaCppServerEngine, OpenAIServerEngine

pytestmark = []

MODEL = "smollm2-135m-instruct"
TURN = "<|im_start|>user\nDescribe the sea.<|im_end|>\n<|im_start|>assistant\n"


def sse(*events: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def pieces_answer(texts: list[str], tokens: int | None = None) -> str:
    events: list[dict[str, Any]] = [
        {"choices": [{"text": t, "finish_reason": None}]} for t in texts
    ]
    events[-1]["choices"][0]["finish_reason"] = "stop"
    if tokens is not None:
        events.append(
            {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": tokens}}
        )
    return sse(*events)


class FakeServer:
    """A llama.cpp-server-like API: /v1/models, /props (optional),
    /v1/completions answered by ``answer(prompt)`` (an SSE body)."""

    def __init__(
        self,
        *,
        models: list[str],
        props: dict[str, Any] | None = None,
        status: int = 200,
        answer: Callable[[str], str] | None = None,
    ):
        self.models = models
        self.props = props
        self.status = status
        self.answer = answer or (
            lambda prompt: pieces_answer(["ea is", "", " wide."], tokens=3)
        )
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": m} for m in self.models]})
        if request.url.path == "/props" and self.props is not None:
            return httpx.Response(200, json=self.props)
        if request.url.path == "/v1/completions":
            body = json.loads(request.content)
            self.bodies.append(body)
            if self.status != 200:
                return httpx.Response(self.status, text="model crashed")
            return httpx.Response(
                200,
                text=self.answer(body["prompt"]),
                headers={"content-type": "text/event-stream"},
            )
        return httpx.Response(404)


def engine_for(server: FakeServer, cls=OpenAIServerEngine, **kwargs: Any):
    return cls(
        base_url="http://llm.test",
        model=MODEL,
        transport=httpx.MockTransport(server),
        **kwargs,
    )


async def run(engine, **kwargs: Any) -> tuple[list[str], GenerationResult]:
    result = GenerationResult()
    request = GenerationRequest(model=MODEL, **kwargs)
    return [piece async for piece in engine.stream(request, result)], result


SEA = [{"role": "user", "content": "Describe the sea."}]


@pytest.mark.asyncio
async def test_it_sends_the_rendered_chat_as_a_raw_completion() -> None:
    server = FakeServer(models=["smollm2:135m"])
    engine = engine_for(server)
    await engine.load()
    assert engine.loaded_models() == [MODEL]
    pieces, result = await run(
        engine,
        messages=SEA,
        params={"max_tokens": 10, "temperature": 0, "seed": 3, "stop": "\n\n"},
    )
    assert pieces == ["ea is", " wide."]
    assert (result.finish_reason, result.prompt_tokens, result.completion_tokens) == (
        "stop",
        30,
        3,
    )
    body = server.bodies[0]
    assert body["model"] == "smollm2:135m"  # the server's only model
    assert body["prompt"].endswith(TURN)
    assert body["stream"] is True and body["max_tokens"] == 10 and body["seed"] == 3
    assert body["temperature"] == 0 and body["top_p"] == 1.0
    assert body["stop"] == ["\n\n"]
    assert "top_k" not in body  # OpenAI's fields only
    await engine.close()


@pytest.mark.asyncio
async def test_a_continuation_is_healed_back_to_the_start_of_its_last_word() -> None:
    """Prefix "The s": the server is asked to go on from "The" and must say
    " s…" again; only what follows the prefix is passed on."""
    server = FakeServer(
        models=[MODEL], answer=lambda p: pieces_answer([" sea", " is", " wide."], 3)
    )
    engine = engine_for(server)
    await engine.load()
    pieces, result = await run(engine, messages=SEA, continue_from="The s")
    assert pieces == ["ea", " is", " wide."]
    assert result.completion_tokens == 3  # " sea" made new text: it counts
    assert len(server.bodies) == 1 and server.bodies[0]["prompt"].endswith(TURN + "The")
    await engine.close()


@pytest.mark.asyncio
async def test_events_that_only_re_produce_the_tail_are_not_counted() -> None:
    server = FakeServer(
        models=[MODEL], answer=lambda p: pieces_answer([" mom", "ent", " of"], 3)
    )
    engine = engine_for(server)
    await engine.load()
    pieces, result = await run(engine, messages=SEA, continue_from="A momen")
    assert pieces == ["t", " of"]
    assert result.completion_tokens == 2
    await engine.close()


@pytest.mark.asyncio
async def test_a_healing_that_does_not_hold_is_asked_again_unhealed() -> None:
    """The server chose another word than the prefix's: nothing of it is
    sent; the prefix is sent whole and the server goes on from it."""

    def answer(prompt: str) -> str:
        if prompt.endswith("The"):
            return pieces_answer([" ocean", " is"], 2)
        return pieces_answer(["ea", " is"], 2)

    server = FakeServer(models=[MODEL], answer=answer)
    engine = engine_for(server)
    await engine.load()
    pieces, result = await run(engine, messages=SEA, continue_from="The s")
    assert pieces == ["ea", " is"]
    assert result.completion_tokens == 2
    assert len(server.bodies) == 2
    assert server.bodies[0]["prompt"].endswith(TURN + "The")
    assert server.bodies[1]["prompt"].endswith(TURN + "The s")
    await engine.close()


@pytest.mark.asyncio
async def test_an_answer_ending_inside_the_tail_is_asked_again_unhealed() -> None:
    def answer(prompt: str) -> str:
        return pieces_answer([" mo"], 1) if prompt.endswith("A") else pieces_answer(["t"], 1)

    server = FakeServer(models=[MODEL], answer=answer)
    engine = engine_for(server)
    await engine.load()
    pieces, _ = await run(engine, messages=SEA, continue_from="A momen")
    assert pieces == ["t"] and len(server.bodies) == 2
    await engine.close()


@pytest.mark.asyncio
async def test_without_usage_the_tokens_are_the_events_never_above_the_text() -> None:
    server = FakeServer(models=[MODEL], answer=lambda p: pieces_answer(["a", "b", "c"]))
    engine = engine_for(server)
    await engine.load()
    _, result = await run(engine, prompt="x")
    assert result.completion_tokens == 3
    server.answer = lambda p: pieces_answer(["ab"], tokens=9)  # an inflated count
    _, result = await run(engine, prompt="x")
    assert result.completion_tokens == 2
    await engine.close()


@pytest.mark.asyncio
async def test_llamacpp_server_gets_the_reference_engines_sampler() -> None:
    """llama.cpp's server defaults to a repeat penalty of 1.1: left so, its
    answers at temperature 0 differ from the in-process engine's."""
    server = FakeServer(models=[MODEL])
    engine = engine_for(server, cls=LlamaCppServerEngine)
    await engine.load()
    assert engine.name == "llamacpp-server"
    await run(engine, prompt="Hi", params={"max_tokens": 4})
    body = server.bodies[0]
    assert (body["top_k"], body["min_p"], body["repeat_penalty"]) == (40, 0.05, 1.0)
    assert body["cache_prompt"] is False
    assert body["temperature"] == 1.0  # OpenAI's default, as in process
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
    await run(engine, messages=[{"role": "user", "content": "hi"}], continue_from="Wel")
    assert server.bodies[-1]["prompt"] == "[hi]>Wel"
    await engine.close()


@pytest.mark.asyncio
async def test_a_server_error_is_a_generation_error() -> None:
    engine = engine_for(FakeServer(models=[MODEL], status=500))
    await engine.load()
    with pytest.raises(GenerationError, match="500"):
        await run(engine, prompt="x")
    server = FakeServer(models=[MODEL], answer=lambda p: sse({"error": {"message": "boom"}}))
    engine = engine_for(server)
    await engine.load()
    with pytest.raises(GenerationError, match="boom"):
        await run(engine, prompt="x")
    await engine.close()


@pytest.mark.asyncio
async def test_load_fails_when_the_model_is_not_served_or_the_server_is_down() -> None:
    engine = engine_for(FakeServer(models=["a", "b"]))
    with pytest.raises(ModelLoadError, match="--engine-model"):
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
    await run(engine, prompt="Hi", params={"max_tokens": 4, "seed": seed})
    assert server.bodies[0]["seed"] == sent
    await engine.close()
