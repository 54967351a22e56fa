"""Ollama's own API as the engine (``--engine ollama``).

Written from Ollama's API documentation (``docs/api.md`` of ollama/ollama, and
its page on errors); Ollama cannot run here, so the tests replay exchanges
shaped as that documentation shows them (``tests/agent/test_ollama_engine.py``).

- ``GET /api/tags`` lists the local models (``models[].name``, ``model:tag``).
- ``POST /api/show`` gives the model's ``modelfile``, whose ``FROM`` line names
  the GGUF blob on this machine: its chat template is read from that file.
- ``POST /api/generate`` with ``"model"`` alone loads the model (at ``load``).
- ``POST /api/generate`` with ``"raw": true`` takes the prompt as is, with no
  template of Ollama's: the engine sends the model's own chat template, rendered,
  followed by the answer so far, so a continuation goes on from the exact prefix
  (healed: ``server.ServerEngine``). The answer streams as JSON lines
  (``{"response": "…", "done": false}``), the last with ``done``,
  ``done_reason`` (``stop``/``length``), ``prompt_eval_count`` and
  ``eval_count`` (tokens). An error is ``{"error": "…"}``: the body of a non-200
  answer, or a line of the stream once it has begun.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from agent.engines.base import GenerationError, GenerationRequest, ModelLoadError
from agent.engines.server import (
    MIN_P,
    REPEAT_PENALTY,
    TOP_K,
    ServerEngine,
    ServerEvent,
    sampling_fields,
)
from agent.weights import ollama_blob_sha256

log = logging.getLogger(__name__)

_FROM_LINE = re.compile(r"^FROM\s+(\S.*?)\s*$", re.MULTILINE)


class OllamaEngine(ServerEngine):
    """Drives one model of a local Ollama server (see ``ServerEngine`` for the
    options; ``server_model`` is Ollama's ``model:tag`` name)."""

    name = "ollama"
    default_url = "http://127.0.0.1:11434"

    async def load(self) -> None:
        """Find the model among Ollama's, read its chat template and the
        weights of its blob (its digest is the blob's name), load it.

        Raises ``ModelLoadError`` when Ollama is unreachable, lacks the model,
        no chat template is found, or loading the model fails.
        """
        served = await self._models_list("/api/tags", "models", "name")
        wanted = self.server_model or self.model_id
        if wanted not in served and f"{wanted}:latest" in served:
            self.server_model = f"{wanted}:latest"  # a name without tag: ``latest``
        self.server_model = self._server_model_pick(served)
        version = await self._get_json("/api/version")
        self.version = f"ollama {(version or {}).get('version') or 'unknown'}"
        blob = await self._blob_path()
        self._template = self._template_load(gguf=blob)
        await self._weights_declare(blob, sha256=ollama_blob_sha256(blob or ""))
        await self._post("/api/generate", {"model": self.server_model, "stream": False})
        self._serving()

    async def _blob_path(self) -> Path | None:
        """The model's GGUF file, from ``/api/show``'s ``modelfile`` ``FROM``
        line, when it is a file on this machine (Ollama runs here); else None."""
        try:
            shown = await self._post("/api/show", {"model": self.server_model})
        except ModelLoadError as exc:
            log.warning("%s", exc)
            return None
        match = _FROM_LINE.search(str(shown.get("modelfile") or ""))
        if match and Path(match.group(1)).is_file():
            return Path(match.group(1))
        return None

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body``; the JSON object answered. Raises ``ModelLoadError``
        naming Ollama's ``error`` on a failure."""
        try:
            response = await self._client.post(path, json=body)
            data = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ModelLoadError(
                self.model_id, f"{self.base_url}{path}: {type(exc).__name__}: {exc}"
            ) from exc
        if response.status_code != 200 or not isinstance(data, dict):
            error = data.get("error") if isinstance(data, dict) else data
            raise ModelLoadError(
                self.model_id,
                f"{self.base_url}{path} answered {response.status_code}: {error}",
            )
        return data

    def body(self, request: GenerationRequest, prefix: str) -> dict[str, Any]:
        """The ``/api/generate`` body: raw prompt, streamed, the reference
        engine's sampler in ``options`` (``num_predict`` is ``max_tokens``)."""
        options: dict[str, Any] = {
            **sampling_fields(request),
            "top_k": TOP_K,
            "min_p": MIN_P,
            "repeat_penalty": REPEAT_PENALTY,
            "num_predict": request.max_tokens(),
        }
        if request.stop():
            options["stop"] = request.stop()
        return {
            "model": self.server_model,
            "prompt": self.render(request, prefix),
            "raw": True,
            "stream": True,
            "options": options,
        }

    async def _events(
        self, request: GenerationRequest, prefix: str
    ) -> AsyncIterator[ServerEvent]:
        """Stream ``/api/generate`` (JSON lines). Raises ``GenerationError`` on
        an HTTP error, an ``error`` object, or a malformed line."""
        body = self.body(request, prefix)
        try:
            async with self._client.stream("POST", "/api/generate", json=body) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode("utf-8", errors="replace")
                    raise GenerationError(
                        f"{self.base_url} answered {response.status_code}: "
                        f"{_error_text(detail)[:300]}"
                    )
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    event = generate_event(json.loads(line))
                    yield event
                    if event.finish_reason:
                        break
        except httpx.HTTPError as exc:
            raise GenerationError(
                f"{self.base_url}: {type(exc).__name__}: {exc}"
            ) from exc
        except (ValueError, TypeError, AttributeError) as exc:
            raise GenerationError(
                f"{self.base_url} sent a malformed line: {exc}"
            ) from exc


def generate_event(line: dict[str, Any]) -> ServerEvent:
    """One ``/api/generate`` stream line as an event. ``{"error": …}`` is a
    ``GenerationError``; the ``done`` line carries the finish and the counts."""
    if "error" in line:
        raise GenerationError(f"ollama failed: {line['error']}")
    event = ServerEvent(text=str(line.get("response") or ""))
    if line.get("done"):
        event.finish_reason = "length" if line.get("done_reason") == "length" else "stop"
        event.prompt_tokens = line.get("prompt_eval_count")
        event.completion_tokens = line.get("eval_count")
    return event


def _error_text(body: str) -> str:
    """Ollama's ``error`` message out of an error body, else the body."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    return str(data.get("error", body)) if isinstance(data, dict) else body
