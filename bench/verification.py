"""Calibration of the verification judge on the real model (docs/trust.md).

Usage: ``.venv/bin/python -m bench.verification [--prompts 30] [--max-tokens 64]
[--save var/verification.json | --load var/verification.json]``

SmolLM2-135M-Instruct through the in-process engine (``llamacpp``). Honest
answers are the engine's own (``LlamaCppEngine.stream``) at temperatures 0, 0.7
and 1 (and 0.7 with top-p 0.9) for varied chat prompts; cheats' answers are made
here, by llama.cpp directly, not by the code that judges them:

* ``hot``: the model sampled at 1.5 with the engine's filters (top-k 40, min-p
  0.05), whatever temperature was asked; ``hot raw``: at 1.5 with no filter;
* ``noisy σ``: another model — the reference model with Gaussian noise of
  standard deviation σ added to every logit — at the asked temperature;
* ``other answer``: the honest greedy answer of another prompt (a replayed or
  cached answer); ``junk``: random English words.

Each answer is scored by prefill through the engine (``LlamaCppEngine.score``,
what a verifying agent runs), its ``scores`` entries parsed and judged by
``trust.verification.plausibility`` as the coordinator does. Prints, per class
and asked temperature, the answers flagged implausible and the spread of z,
misses and tokens outside the support; ``--save`` keeps the scores (JSON) so
``--load`` re-judges them (new thresholds) without the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine_line  # noqa: E402
from trust.verification.plausibility import (  # noqa: E402
    GREEDY_MISSES_BASE,
    GREEDY_MISSES_SHARE,
    OUTSIDE_BASE,
    OUTSIDE_SHARE,
    REFERENCE_THRESHOLDS,
    Z_MIN,
    Plausibility,
    Thresholds,
    answer_plausible,
    token_scores_parse,
)

MODEL = "smollm2-135m-instruct"
PROMPTS = (
    "What is 2+2?",
    "Explain photosynthesis briefly.",
    "Write a short poem about the sea.",
    "Give three tips for sleeping well.",
    "What is the capital of France?",
    "Describe a cat to someone who has never seen one.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "List five fruits that are red.",
    "Translate 'good morning' into Spanish and French.",
    "Tell me a joke about computers.",
    "How do I boil an egg?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What are the benefits of regular exercise?",
    "Write a haiku about autumn leaves.",
    "Explain what a black hole is to a child.",
    "What is the difference between weather and climate?",
    "Suggest a name for a small bakery.",
    "How many legs does a spider have?",
    "Write an email asking a colleague to reschedule a meeting.",
    "What causes earthquakes?",
    "Give me a recipe for a simple salad.",
    "What is machine learning?",
    "Describe your ideal weekend.",
    "Explain the rules of chess in a few sentences.",
    "Why do leaves change colour in the fall?",
    "Write a short story that starts with 'The door creaked open'.",
    "What is the boiling point of water in Fahrenheit?",
    "How does a bicycle stay upright?",
    "Give two arguments for and against homework.",
)
HONEST = ((0.0, 1.0), (0.7, 1.0), (1.0, 1.0), (0.7, 0.9))
"""(temperature, top_p) of the honest answers."""
ASKED = (0.0, 0.7, 1.0)
"""Temperatures the cheats are asked for (top_p 1)."""
WORDS = (
    "the of and to in is that it was for on are with as his they be at one have "
    "this from or had by word but what some we can out other were all there when "
    "up use your how said an each she which do their time if will way about many"
).split()


@dataclass(frozen=True)
class Cheat:
    """How a cheat answers: ``temperature`` (None: the asked one), with or
    without the engine's top-k/min-p (``filters``), ``sigma``: Gaussian noise
    added to every logit (another model)."""

    name: str
    temperature: float | None = None
    filters: bool = True
    sigma: float = 0.0


CHEATS = (
    Cheat("hot", temperature=1.5),
    Cheat("hot raw", temperature=1.5, filters=False),
    Cheat("noisy σ1", sigma=1.0),
    Cheat("noisy σ2", sigma=2.0),
)


def request_make(
    prompt: str | list[dict], temperature: float, top_p: float, max_tokens: int, seed: int | None
):
    """A chat request to the reference model: ``prompt`` one user message's
    text, or the whole conversation (a list of messages)."""
    from agent.engines.base import GenerationRequest

    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return GenerationRequest(
        model=MODEL,
        messages=messages,
        params={"temperature": temperature, "top_p": top_p,
                "max_tokens": max_tokens, "seed": seed},
    )  # fmt: skip


def cheat_answer(engine: Any, request: Any, cheat: Cheat, seed: int) -> str:
    """One cheat's answer, by llama.cpp's own generate loop (the engine's model
    and lock, none of its generation code)."""
    import llama_cpp
    import numpy as np

    from agent.engines.prefill import prompt_tokenize
    from agent.engines.sampling import MIN_P, TOP_K, sampling_params

    asked, top_p = sampling_params(request.params)
    temperature = asked if cheat.temperature is None else cheat.temperature
    rng = np.random.default_rng(seed)

    def noise(_ids: Any, logits: Any) -> Any:
        return logits + rng.normal(0.0, cheat.sigma, logits.shape).astype(logits.dtype)

    with engine._lock:
        llama = engine._llama
        tokens = prompt_tokenize(llama, engine.render(request))
        llama.reset()
        llama.set_seed(seed)
        out = b""
        sampled = llama.generate(
            tokens, temp=temperature, top_p=top_p,
            top_k=TOP_K if cheat.filters else 0,
            min_p=MIN_P if cheat.filters else 0.0, repeat_penalty=1.0,
            logits_processor=llama_cpp.LogitsProcessorList([noise]) if cheat.sigma else None,
        )  # fmt: skip
        for count, token in enumerate(sampled, start=1):
            if llama_cpp.llama_vocab_is_eog(engine._vocab, token):
                break
            out += engine._pieces[token]
            if count >= request.max_tokens():
                break
    return out.decode("utf-8", errors="ignore")


async def answers_generate(
    engine: Any,
    prompts: list[str],
    temperature: float,
    cheat: Cheat | None = None,
    *,
    top_p: float = 1.0,
    max_tokens: int = 64,
) -> list[str]:
    """Answers to ``prompts`` (chat, one user message each) asked at
    ``temperature``/``top_p``: the engine's honest ones (``cheat`` None, seeded
    by the prompt's index) or ``cheat``'s."""
    from agent.engines.base import GenerationResult

    answers = []
    for seed, prompt in enumerate(prompts):
        request = request_make(prompt, temperature, top_p, max_tokens, seed)
        if cheat is None:
            result = GenerationResult()
            answers.append("".join([p async for p in engine.stream(request, result)]))
        else:
            answers.append(await asyncio.to_thread(cheat_answer, engine, request, cheat, seed))
    return answers


def junk_answers(prompts: list[str], words: int = 40) -> list[str]:
    """Random English words, one answer per prompt (seeded)."""
    rng = random.Random(22)
    return [" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "." for _ in prompts]


async def answers_score(
    engine: Any,
    prompts: list[str],
    answers: list[str],
    temperature: float,
    *,
    top_p: float = 1.0,
    max_tokens: int = 64,
) -> list[list[dict[str, Any]]]:
    """Each answer scored by prefill through ``engine`` as a verify offer asks
    (the ``scores`` frame's ``tokens`` entries)."""
    scored = []
    for seed, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        request = request_make(prompt, temperature, top_p, max_tokens, seed)
        result = await engine.score(request, answer)
        scored.append([token.frame() for token in result.tokens])
    return scored


def judge(
    temperature: float,
    entries: list[dict[str, Any]],
    max_tokens: int,
    thresholds: Thresholds = REFERENCE_THRESHOLDS,
) -> Plausibility:
    """The coordinator's verdict on one answer's ``scores`` entries, by the
    model's ``thresholds`` (SmolLM2 Q4_1's, the reference model's, unless
    told)."""
    tokens = token_scores_parse(entries, max_tokens=max_tokens)
    return answer_plausible(temperature=temperature, tokens=tokens, thresholds=thresholds)


async def calibrate(n_prompts: int, max_tokens: int) -> list[dict[str, Any]]:
    """Generate and score every class; rows ``{"class", "temperature", "top_p",
    "scores": [[entry, ...], ...]}``."""
    from agent.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(model=MODEL)
    await engine.load()
    prompts = list(PROMPTS[:n_prompts])
    rows: list[dict[str, Any]] = []

    async def add(name: str, temperature: float, top_p: float, answers: list[str]) -> None:
        started = time.perf_counter()
        scores = await answers_score(engine, prompts, answers, temperature, top_p=top_p, max_tokens=max_tokens)
        tokens = sum(map(len, scores))
        rows.append({"class": name, "temperature": temperature, "top_p": top_p,
                     "answers": answers, "scores": scores})  # fmt: skip
        took = time.perf_counter() - started
        print(f"  scored {name} T={temperature:g} p={top_p:g}: {tokens} tokens, "
              f"{took / max(1, tokens) * 1000:.1f} ms a token", flush=True)  # fmt: skip

    greedy: list[str] = []
    for temperature, top_p in HONEST:
        answers = await answers_generate(engine, prompts, temperature, top_p=top_p, max_tokens=max_tokens)
        greedy = greedy or answers
        await add("honest", temperature, top_p, answers)
    for cheat in CHEATS:
        fixed = None
        if cheat.temperature is not None:  # one set of answers, whatever was asked
            fixed = await answers_generate(engine, prompts, 0.0, cheat, max_tokens=max_tokens)
        for asked in ASKED:
            answers = fixed or await answers_generate(engine, prompts, asked, cheat, max_tokens=max_tokens)
            await add(cheat.name, asked, 1.0, answers)
    for asked in ASKED:
        await add("other answer", asked, 1.0, greedy[1:] + greedy[:1])
        await add("junk", asked, 1.0, junk_answers(prompts))
    await engine.close()
    return rows


def table(rows: list[dict[str, Any]], max_tokens: int) -> list[str]:
    """The calibration table (Markdown): per class and asked temperature."""
    lines = [
        "| class | T | top_p | answers | flagged | z min / median / max | misses/token | outside/token |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        verdicts = [judge(row["temperature"], s, max_tokens) for s in row["scores"]]
        tokens = max(1, sum(v.n for v in verdicts))
        zs = sorted(v.z for v in verdicts)
        flagged = sum(not v.plausible for v in verdicts)
        z = (f"{zs[0]:.1f} / {statistics.median(zs):.1f} / {zs[-1]:.1f}"
             if row["temperature"] > 0 else "—")  # fmt: skip
        lines.append(
            f"| {row['class']} | {row['temperature']:g} | {row['top_p']:g} | {len(verdicts)} "
            f"| {flagged} ({flagged / max(1, len(verdicts)):.0%}) | {z} "
            f"| {sum(v.misses for v in verdicts) / tokens:.3f} "
            f"| {sum(v.outside for v in verdicts) / tokens:.3f} |"
        )  # fmt: skip
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--save", type=Path, help="write the scores here (JSON)")
    parser.add_argument("--load", type=Path, help="judge these saved scores")
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    if args.load:
        saved = json.loads(args.load.read_text())
        rows, args.max_tokens = saved["rows"], saved["max_tokens"]
    else:
        print(f"settings: SmolLM2-135M-Instruct Q4_1, {args.prompts} chat prompts, "
              f"answers of at most {args.max_tokens} tokens", flush=True)  # fmt: skip
        rows = asyncio.run(calibrate(args.prompts, args.max_tokens))
        if args.save:
            args.save.parent.mkdir(parents=True, exist_ok=True)
            args.save.write_text(json.dumps({"max_tokens": args.max_tokens, "rows": rows}))
    print(f"thresholds: z >= {Z_MIN:g} (T > 0); misses <= {GREEDY_MISSES_BASE} + "
          f"{GREEDY_MISSES_SHARE:g}·n (T = 0); outside <= {OUTSIDE_BASE} + {OUTSIDE_SHARE:g}·n")  # fmt: skip
    print("\n".join(table(rows, args.max_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
