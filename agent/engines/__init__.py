"""Inference engines behind one interface (``agent.engines.base.Engine``)."""

from __future__ import annotations

from typing import Any

from agent.engines.base import (
    Engine,
    GenerationError,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
)

ENGINE_NAMES = ("llamacpp", "llamacpp-server", "ollama", "vllm", "openai", "scripted")

__all__ = [
    "ENGINE_NAMES",
    "Engine",
    "GenerationError",
    "GenerationRequest",
    "GenerationResult",
    "ModelLoadError",
    "engine_create",
]


def engine_create(name: str, **opts: Any) -> Engine:
    """Build an engine by name with its keyword options.

    - ``llamacpp``: ``model``, ``model_path``, ``n_ctx``, ``n_gpu_layers``
    - ``llamacpp-server``, ``ollama``, ``vllm``, ``openai`` (a local server):
      ``base_url``, ``model``, ``server_model``, ``chat_template_gguf``
      (``agent.engines.server.ServerEngine``)
    - ``scripted``: ``script`` (dict), ``model``

    Options set to None are dropped (the engine's default applies). Raises
    ``ValueError`` for an unknown name.
    """
    opts = {key: value for key, value in opts.items() if value is not None}
    if name == "llamacpp":
        from agent.engines.llamacpp import LlamaCppEngine

        return LlamaCppEngine(**opts)
    if name == "llamacpp-server":
        from agent.engines.openai_server import LlamaCppServerEngine

        return LlamaCppServerEngine(**opts)
    if name == "ollama":
        from agent.engines.ollama import OllamaEngine

        return OllamaEngine(**opts)
    if name == "vllm":
        from agent.engines.vllm import VLLMEngine

        return VLLMEngine(**opts)
    if name == "openai":
        from agent.engines.openai_server import OpenAIServerEngine

        return OpenAIServerEngine(**opts)
    if name == "scripted":
        from agent.engines.scripted import ScriptedEngine

        return ScriptedEngine(**opts)
    raise ValueError(f"unknown engine {name!r}; one of {', '.join(ENGINE_NAMES)}")
