"""vLLM's OpenAI-compatible server as the engine (``--engine vllm``).

Written from vLLM's documentation of its OpenAI-compatible server (its "extra
parameters" of the chat and completions APIs); vLLM needs a GPU and cannot run
here, so the tests replay exchanges shaped as that documentation and OpenAI's
streaming format show them (``tests/agent/test_vllm_engine.py``).

- ``GET /v1/models`` lists the served models (``data[].id``); ``GET /version``
  gives vLLM's version.
- A chat answer is ``POST /v1/chat/completions``, streamed, with vLLM's own
  chat template (from the model's tokenizer configuration). A continuation
  sends the answer so far as a last ``assistant`` message with
  ``continue_final_message: true`` and ``add_generation_prompt: false``: the
  template leaves that message open and the model goes on from it (healed:
  ``server.ServerEngine``).
- A raw prompt is ``POST /v1/completions`` with the prompt followed by the
  answer so far.
- The reference engine's sampler: ``top_k`` 40, ``min_p`` 0.05,
  ``repetition_penalty`` 1 (vLLM's extra sampling parameters). Token counts
  come from ``usage`` (``stream_options.include_usage``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agent.engines.base import GenerationError, GenerationRequest
from agent.engines.chat_template import message_flatten
from agent.engines.openai_server import completion_events
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


class VLLMEngine(ServerEngine):
    """Drives one model of a local vLLM server (see ``ServerEngine`` for the
    options; ``server_model`` is the name vLLM serves it under). No GGUF: the
    chat template is vLLM's."""

    name = "vllm"
    default_url = "http://127.0.0.1:8000"

    async def load(self) -> None:
        """Check that vLLM serves the model. Raises ``ModelLoadError`` when the
        server is unreachable or does not list it."""
        served = await self._models_list("/v1/models", "data", "id")
        self.server_model = self._server_model_pick(served)
        version = await self._get_json("/version")
        self.version = f"vllm {(version or {}).get('version') or 'unknown'}"
        await self._weights_declare()  # vLLM tells no file: ``model_path``'s
        self._serving()

    def body(self, request: GenerationRequest, prefix: str) -> tuple[str, dict[str, Any]]:
        """``(path, body)`` of the request for ``request`` continued from ``prefix``."""
        body: dict[str, Any] = {
            "model": self.server_model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens(),
            **sampling_fields(request),
            "top_k": TOP_K,
            "min_p": MIN_P,
            "repetition_penalty": REPEAT_PENALTY,
        }
        if request.stop():
            body["stop"] = request.stop()
        if request.messages is None:
            body["prompt"] = (request.prompt or "") + prefix
            return "/v1/completions", body
        body["messages"] = [message_flatten(m) for m in request.messages]
        if prefix:
            body["messages"].append({"role": "assistant", "content": prefix})
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        return "/v1/chat/completions", body

    async def _events(
        self, request: GenerationRequest, prefix: str
    ) -> AsyncIterator[ServerEvent]:
        """Stream the chat or raw completion (server-sent events). Raises
        ``GenerationError`` on an HTTP error, an ``error`` event, a non-200
        answer or a malformed event."""
        path, body = self.body(request, prefix)
        parse = completion_events if path == "/v1/completions" else chat_events
        async for event in sse_events(
            self._client, base_url=self.base_url, path=path, body=body, parse=parse
        ):
            yield event


def chat_events(chunk: dict[str, Any]) -> list[ServerEvent]:
    """The events of one ``chat.completion.chunk`` (``choices[].delta.content``,
    ``finish_reason``; ``usage`` in the last chunk). An ``error`` object is a
    ``GenerationError``."""
    if chunk.get("error"):
        raise GenerationError(f"the server failed: {chunk['error']}")
    events = [
        ServerEvent(
            text=str((choice.get("delta") or {}).get("content") or ""),
            finish_reason=choice.get("finish_reason") or None,
        )
        for choice in chunk.get("choices") or []
    ]
    return events + usage_events(chunk)
