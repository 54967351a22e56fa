"""How far SmolLM2 Q4_0 answers from the Q4_1 the catalog pins (issue 31 item 5).

Usage: ``.venv/bin/python -m bench.quant_divergence [--prompts 10] [--max-tokens 64]``

A host that declares the Q4_1 file's digest while its engine runs the same
model requantized to Q4_0 by llama.cpp (``tests/models/build.py``) is served
(docs/trust.md): only its answers can give it away. For each prompt, at
temperature 0: the Q4_0 engine's answer and the Q4_1 engine's; the tokens
they share before they part; and the Q4_0 answer scored by prefill through the
Q4_1 engine (what a verifying agent runs) and judged by
``trust.verification.plausibility`` at temperature 0, as verification judges it
(``bench/verification.py``'s scoring). Prints one line per prompt and the
totals (identical answers, tokens in common, greedy misses per token, answers
flagged).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.engines.base import GenerationResult  # noqa: E402
from agent.engines.llamacpp import LlamaCppEngine  # noqa: E402
from bench.common import machine_line  # noqa: E402
from bench.verification import MODEL, PROMPTS, judge, request_make  # noqa: E402
from tests.models.build import smollm2_q4_0  # noqa: E402


async def greedy(engine: LlamaCppEngine, prompt: str, max_tokens: int) -> list[str]:
    """The engine's answer at temperature 0, as the pieces it streamed."""
    request = request_make(prompt, 0.0, 1.0, max_tokens, 0)
    return [p async for p in engine.stream(request, GenerationResult())]


def shared_prefix(a: list[str], b: list[str]) -> int:
    """Pieces (about one token each) the two answers share before they part."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


async def measure(n_prompts: int, max_tokens: int) -> int:
    pinned = LlamaCppEngine(model=MODEL)
    cheaper = LlamaCppEngine(model=MODEL, model_path=smollm2_q4_0())
    await pinned.load()
    await cheaper.load()
    same = shared = pieces = misses = scored = flagged = 0
    print("| prompt | Q4_1 tokens | Q4_0 tokens | in common | misses | verdict |")
    print("| --- | --- | --- | --- | --- | --- |")
    for prompt in PROMPTS[:n_prompts]:
        reference = await greedy(pinned, prompt, max_tokens)
        answer = await greedy(cheaper, prompt, max_tokens)
        request = request_make(prompt, 0.0, 1.0, max_tokens, 0)
        score = await pinned.score(request, "".join(answer))
        verdict = judge(0.0, [t.frame() for t in score.tokens], max_tokens)
        common = shared_prefix(reference, answer)
        same += reference == answer
        shared += common
        pieces += len(answer)
        misses += verdict.misses
        scored += verdict.n
        flagged += not verdict.plausible
        print(
            f"| {prompt[:40]} | {len(reference)} | {len(answer)} | {common}"
            f" | {verdict.misses}/{verdict.n}"
            f" | {'plausible' if verdict.plausible else 'flagged'} |",
            flush=True,
        )
    await pinned.close()
    await cheaper.close()
    print(
        f"\n{n_prompts} prompts at temperature 0, {max_tokens} tokens at most:"
        f" {same} identical answers; {shared}/{pieces} Q4_0 tokens before the"
        f" answers part; greedy misses {misses}/{scored}"
        f" ({misses / max(1, scored):.3f} a token) under Q4_1's prefill;"
        f" {flagged} answers flagged implausible"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    return asyncio.run(measure(args.prompts, args.max_tokens))


if __name__ == "__main__":
    sys.exit(main())
