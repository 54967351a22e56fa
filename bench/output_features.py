"""What a ``response_format`` and ``logprobs`` cost the in-process llama.cpp
engine: tokens per second of the same request plain, under a JSON schema's
grammar (the 64-likeliest check first, ``agent.engines.constrained``), under the
grammar checked over the whole vocabulary every token (the baseline the first
check avoids), and with 5 alternatives' log-probabilities. Rounds interleave
the variants, so a busy machine slows them alike; prints medians and ratios.

    .venv/bin/python -m bench.output_features [--rounds 5] [--tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from agent.engines import constrained
from agent.engines.base import GenerationRequest, GenerationResult
from agent.engines.llamacpp import LlamaCppEngine
from bench.common import machine_line

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "people": {"type": "integer"},
        "streets": {"type": "array", "items": {"type": "string", "maxLength": 16}},
    },
    "required": ["name", "people", "streets"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}


async def rate(engine: LlamaCppEngine, tokens: int, **fields) -> float:
    """Tokens per second of one generation (temperature 0)."""
    request = GenerationRequest(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": "Describe a city as JSON."}],
        params={"temperature": 0, "max_tokens": tokens},
        **fields,
    )
    result = GenerationResult()
    start = time.perf_counter()
    async for _ in engine.stream(request, result):
        pass
    return result.completion_tokens / (time.perf_counter() - start)


async def main(rounds: int, tokens: int) -> None:
    engine = LlamaCppEngine()
    await engine.load()
    variants = {
        "plain": {},
        "json_schema": {"response_format": FORMAT},
        "json_schema, whole vocabulary": {"response_format": FORMAT},
        "logprobs (5 alternatives)": {"logprobs": 5},
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    top = constrained.GRAMMAR_TOP
    for _ in range(rounds):
        for name, fields in variants.items():
            constrained.GRAMMAR_TOP = 0 if "whole" in name else top
            rates[name].append(await rate(engine, tokens, **fields))
    constrained.GRAMMAR_TOP = top
    print(machine_line())
    base = statistics.median(rates["plain"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:32} {median:7.1f} tokens/s  {median / base:5.2f} of plain")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.tokens))
