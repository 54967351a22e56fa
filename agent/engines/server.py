"""What the engines behind a local inference server share.

``ServerEngine`` holds the HTTP client, finds the model's chat template, and
continues an answer exactly by **text healing**: the server's tokens are out of
the agent's sight, so the prefix is cut back to where its last word begins
(``decoding.text_heal_split``), the server is asked to go on from there, and its
text must re-produce the cut-off tail before anything new is passed on
(``decoding.TextHealer``). When it does not (sampling chose another word, or the
server's arithmetic differs), nothing has been sent yet: the request is made
again with the whole prefix, unhealed. Subclasses say how one request is made
and read (``_events``): llama.cpp's server and other OpenAI-compatible servers
(``openai_server``), Ollama (``ollama``), vLLM (``vllm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
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
from agent.engines.decoding import HealDiverged, TextHealer, text_heal_split
from agent.engines.gguf import gguf_chat_template
from agent.engines.llamacpp import DEFAULT_MODEL_ID, smollm2_gguf_path
from agent.weights import weights_or_none

log = logging.getLogger(__name__)

# The reference engine's sampler (``llamacpp.LlamaCppEngine``): a server left at
# its own defaults (llama.cpp's and Ollama's repeat penalty 1.1, Ollama's
# temperature 0.8) answers differently, and a calibrated canary fails it.
TOP_K = 40
MIN_P = 0.05
REPEAT_PENALTY = 1.0
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


@dataclass
class ServerEvent:
    """One parsed piece of a server's streamed answer: ``text`` (may be empty),
    and, once the server says them, ``finish_reason`` (``stop``/``length``) and
    token counts (tokens)."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class ServerEngine(Engine):
    """An engine that drives one model of a local server over HTTP.

    ``model`` is the catalog id reported to the coordinator; ``server_model`` the
    name the server knows it by (default: ``model`` if the server lists it, else
    the server's only model). ``chat_template_gguf``: the GGUF file to read the
    chat template from when the server exposes none. ``model_path``: the GGUF
    file the server was started with, whose weights are declared when the
    server does not tell its own (``_weights_declare``). ``transport`` lets
    tests plug in an ``httpx.MockTransport``.
    """

    default_url = "http://127.0.0.1:8080"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        model: str = DEFAULT_MODEL_ID,
        server_model: str | None = None,
        chat_template_gguf: str | Path | None = None,
        model_path: str | Path | None = None,
        timeout_s: float = 300.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.version = "unknown"
        self.base_url = (base_url or self.default_url).rstrip("/")
        self.model_id = model
        self.server_model = server_model
        self.chat_template_gguf = (
            Path(chat_template_gguf) if chat_template_gguf else None
        )
        self.model_path = Path(model_path) if model_path else None
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

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

    # -- load helpers -------------------------------------------------------

    async def _get_json(self, path: str) -> dict[str, Any] | None:
        """GET ``path``; its JSON object, or None (any error, non-200, non-object)."""
        try:
            response = await self._client.get(path)
            if response.status_code != 200:
                return None
            data = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    async def _models_list(self, path: str, key: str, field: str) -> list[str]:
        """The model names the server lists at ``path`` (``{key: [{field: name}]}``).

        Raises ``ModelLoadError`` when the server is unreachable or answers
        something else.
        """
        try:
            response = await self._client.get(path)
            response.raise_for_status()
            return [str(item[field]) for item in response.json()[key]]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(
                self.model_id, f"cannot list models at {self.base_url}{path}: {exc}"
            ) from exc

    def _serving(self) -> None:
        """Mark the model loaded (``load`` done) and say which server serves it."""
        self._loaded = True
        log.info(
            "serving %s as %s from %s (%s)",
            self.model_id,
            self.server_model,
            self.base_url,
            self.version,
        )

    async def _weights_declare(
        self, served_file: str | Path | None = None, *, sha256: str | None = None
    ) -> None:
        """Declare the weights of the file the server runs: ``served_file`` (the
        server's own word: llama.cpp's ``/props`` ``model_path``, Ollama's blob,
        whose name is its ``sha256``) when it is a file here, else
        ``model_path``; none when neither is (``agent.weights``)."""
        path = served_file if served_file and Path(served_file).is_file() else None
        if path is None:
            path, sha256 = self.model_path, None
        weights = await asyncio.to_thread(weights_or_none, path, sha256=sha256)
        if weights is not None:
            self.weights_loaded = {self.model_id: weights}
        else:
            log.warning(
                "%s: which weights the server runs is unknown (pass --model-path):"
                " no work of a catalog model that pins its weights",
                self.model_id,
            )

    def _server_model_pick(self, served: list[str]) -> str:
        """The server's name for the model: ``server_model`` (which it must
        serve), else the catalog id, else its only model. Raises ``ModelLoadError``."""
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
            f"{self.base_url} serves {served}; name one with --engine-model",
        )

    def _template_load(
        self,
        source: str = "",
        *,
        bos_token: str = "",
        eos_token: str = "",
        gguf: Path | None = None,
    ) -> ChatTemplate:
        """The chat template: ``source`` when the server gave one, else the one
        in ``gguf``, ``chat_template_gguf`` or the SmolLM2 GGUF (in that order).

        Raises ``ModelLoadError`` when none is found or it does not compile.
        """
        try:
            if source:
                return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)
            path = gguf or self.chat_template_gguf or smollm2_gguf_path()
            if path is None:
                raise ChatTemplateError(
                    "the server exposes no chat template; "
                    "pass --chat-template-from-gguf"
                )
            text, bos, eos = gguf_chat_template(path)
            log.info("chat template of %s read from %s", self.model_id, path)
            return ChatTemplate(text, bos_token=bos, eos_token=eos)
        except (ChatTemplateError, OSError, ValueError) as exc:
            raise ModelLoadError(
                self.model_id, f"no usable chat template: {exc}"
            ) from exc

    # -- generation ---------------------------------------------------------

    def render(self, request: GenerationRequest, prefix: str) -> str:
        """The raw prompt: the rendered conversation (or raw prompt) + ``prefix``.

        Raises ``GenerationError`` when the messages cannot be rendered.
        """
        try:
            return prompt_build(
                self._template, request.messages, request.prompt, prefix
            )
        except ChatTemplateError as exc:
            raise GenerationError(str(exc)) from exc

    def _events(
        self, request: GenerationRequest, prefix: str
    ) -> AsyncIterator[ServerEvent]:
        """Make one streamed request answering ``request`` as if its answer so
        far were ``prefix``; yield its events. Raises ``GenerationError``."""
        raise NotImplementedError

    async def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[str]:
        """Stream the answer (see ``Engine.stream``), healing a continuation.

        Token counts: the server's (``completion_tokens`` less the events that
        only re-produced the healed tail), else one per event with text; never
        above the characters sent. Raises ``GenerationError``.
        """
        if not self._loaded or request.model != self.model_id:
            raise GenerationError(f"model {request.model} is not loaded")
        sent, tail = text_heal_split(request.continue_from)
        if tail:
            try:
                async with contextlib.aclosing(
                    self._answer(request, sent, result, tail)
                ) as pieces:
                    async for piece in pieces:
                        yield piece
                return
            except HealDiverged as exc:  # nothing was yielded: start again
                log.info("healing %r did not hold (%s); unhealed", tail, exc)
        async with contextlib.aclosing(
            self._answer(request, request.continue_from, result, "")
        ) as pieces:
            async for piece in pieces:
                yield piece

    async def _answer(
        self, request: GenerationRequest, prefix: str, result: GenerationResult, tail: str
    ) -> AsyncIterator[str]:
        """One request; ``result`` is written only when it ends normally."""
        healer = TextHealer(tail)
        finish, prompt_tokens, reported = "stop", 0, None
        healed = counted = chars = 0
        # closed at once when healing fails, so the server stops generating
        async with contextlib.aclosing(self._events(request, prefix)) as events:
            async for event in events:
                if event.text:
                    new = healer.feed(event.text)
                    if new:
                        counted += 1
                        chars += len(new)
                        yield new
                    else:
                        healed += 1
                if event.finish_reason:
                    finish = "length" if event.finish_reason == "length" else "stop"
                if event.prompt_tokens is not None:
                    prompt_tokens = max(0, int(event.prompt_tokens))
                if event.completion_tokens is not None:
                    reported = int(event.completion_tokens)
        if healer.healing:
            raise HealDiverged("the answer ended inside the healed tail")
        tokens = counted if reported is None else max(0, reported - healed)
        result.finish_reason = finish
        result.prompt_tokens = prompt_tokens
        result.completion_tokens = min(tokens, chars)


def sampling_fields(request: GenerationRequest) -> dict[str, Any]:
    """The request's sampling as the reference engine applies it: ``temperature``
    and ``top_p`` (OpenAI's defaults when absent), ``seed`` (32 bits) when given."""
    params = request.params
    fields: dict[str, Any] = {
        "temperature": _number(params.get("temperature"), DEFAULT_TEMPERATURE),
        "top_p": _number(params.get("top_p"), DEFAULT_TOP_P),
    }
    if request.seed() is not None:
        fields["seed"] = request.seed()
    return fields


def _number(value: Any, default: float) -> float:
    return default if value is None else float(value)


async def sse_events(
    client: httpx.AsyncClient,
    *,
    base_url: str,
    path: str,
    body: dict[str, Any],
    parse: Callable[[dict[str, Any]], list[ServerEvent]],
) -> AsyncIterator[ServerEvent]:
    """POST ``body`` to ``path`` and yield the events ``parse`` finds in each
    server-sent event (``data: {json}`` lines, until ``data: [DONE]``). Raises
    ``GenerationError`` on an HTTP error, a non-200 answer, a malformed event or
    an ``error`` object (``parse``'s)."""
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", errors="replace")
                raise GenerationError(
                    f"{base_url} answered {response.status_code}: {detail[:300]}"
                )
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                for event in parse(json.loads(data)):
                    yield event
    except httpx.HTTPError as exc:
        raise GenerationError(f"{base_url}: {type(exc).__name__}: {exc}") from exc
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise GenerationError(f"{base_url} sent a malformed event: {exc}") from exc


def usage_events(chunk: dict[str, Any]) -> list[ServerEvent]:
    """The token counts of an OpenAI-shaped chunk's ``usage`` (sent in the last
    chunk when ``stream_options.include_usage`` asked), as one event; none
    without it."""
    usage = chunk.get("usage")
    if not usage:
        return []
    return [
        ServerEvent(
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
        )
    ]
