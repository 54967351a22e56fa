"""A short local benchmark of the engine: time to first token and decode speed."""

from __future__ import annotations

import time
from typing import Any

from agent.engines.base import Engine, GenerationRequest, GenerationResult
from agent.telemetry import Telemetry

BENCHMARK_MESSAGES = [
    {
        "role": "user",
        "content": "Write a short paragraph about lighthouses and their keepers.",
    }
]


async def benchmark_run(
    engine: Engine,
    *,
    model: str,
    device: int = 0,
    telemetry: Telemetry | None = None,
    max_tokens: int = 128,
) -> dict[str, Any]:
    """Measure one generation of up to ``max_tokens`` tokens at temperature 0
    (after an 8-token warm-up) and return the fields of a ``benchmark`` frame::

        {"device": 0, "model": "...", "tokens_per_s": 41.3, "ttft_ms": 35.0,
         "vram_used_mb": 312 | None}

    ``ttft_ms``: request to first piece (ms). ``tokens_per_s``: tokens after the
    first one divided by the time after the first piece (decode speed, tokens/s).
    ``vram_used_mb``: memory the engine uses on the device (MiB) when known.
    Raises whatever the engine's ``stream`` raises.
    """
    telemetry = telemetry or Telemetry()
    params = {"temperature": 0.0, "seed": 1}
    warmup = GenerationRequest(
        model=model,
        messages=[{"role": "user", "content": "Say hello."}],
        params=params | {"max_tokens": 8},
    )
    async for _ in engine.stream(warmup, GenerationResult()):
        pass
    request = GenerationRequest(
        model=model,
        messages=BENCHMARK_MESSAGES,
        params=params | {"max_tokens": max_tokens},
    )
    result = GenerationResult()
    started = time.perf_counter()
    first: float | None = None
    async for _piece in engine.stream(request, result):
        if first is None:
            first = time.perf_counter()
    ended = time.perf_counter()
    first = first if first is not None else ended
    decode_s = ended - first
    tokens = result.completion_tokens
    if tokens > 1 and decode_s > 0:
        tokens_per_s = (tokens - 1) / decode_s
    else:
        tokens_per_s = tokens / max(ended - started, 1e-9)
    return {
        "device": device,
        "model": model,
        "tokens_per_s": round(tokens_per_s, 2),
        "ttft_ms": round((first - started) * 1000, 1),
        "vram_used_mb": telemetry.memory_used_mb(device),
    }
