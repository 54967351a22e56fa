"""The answers of ``bench/trust.py``'s hosts, written by the real model.

For a set of real-traffic prompts at temperatures 0, 0.7 and 1, each host
behaviour's answer is generated with SmolLM2-135M-Instruct through the agent's
llama.cpp engine and scored by prefill on that engine (``Engine.score``: what a
verifying device returns in its ``scores`` frame); for spot checks, prompts
drawn by the coordinator's generator (``jobs.canarygen``, an unknown secret)
and calibrated as the pool calibrates them, answered by each behaviour.

Behaviours (what a host does; nothing here knows what catches it):

- ``honest``: the engine, the request's parameters;
- ``hot``: the engine at the asked temperature + ``HOT_EXTRA`` (b);
- ``other``: the reference model with Gaussian noise of ``OTHER_SIGMA`` added to
  its logits before sampling, the request's parameters (c; σ 1 is the case a
  single verification catches least often: docs/trust.md);
- ``junk``: random English words (a).

The cheats' answers come from llama.cpp's own generate loop
(``bench.verification.cheat_answer``), none of the agent's generation code.

The bank is kept as JSON (``--bank FILE``) so the fleet can be rerun without the
model.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

HOT_EXTRA = 1.0
OTHER_SIGMA = 1.0
MAX_TOKENS = 48
BEHAVIOURS = ("honest", "hot", "other", "junk")
BANK_TEMPERATURES = (0.0, 0.7, 1.0)
PROMPTS = [
    "Write a short poem about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three uses of copper.",
    "Tell me a story about a dragon who loved tea.",
    "Why is the sky blue?",
    "Write Python code that reverses a list.",
    "What should I pack for a weekend of hiking?",
    "Give me three tips for a job interview.",
    "Describe the city of Paris to a child.",
    "How does a refrigerator keep food cold?",
    "Summarise the plot of Romeo and Juliet.",
    "What is the difference between weather and climate?",
    "Suggest a name for a bakery and explain it.",
    "How do I make a cup of green tea?",
    "Write a haiku about autumn leaves.",
    "What are the benefits of regular exercise?",
]
SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass
class Answer:
    """One answer: ``text``; ``completion_tokens`` the host's true count;
    ``recount`` the coordinator's (``jobs.tokens.token_count``); ``scores`` the
    verifier's ``scores`` frame entries for what a verifier is sent of it
    (``verify_text``, None: ``text`` whole; None for a spot check's);
    ``token_ids`` the ids the host's engine drew (the honest engine's, as its
    ``done.token_ids``; None for the cheats' own loops)."""

    behaviour: str
    temperature: float
    text: str
    completion_tokens: int
    recount: int
    scores: list[dict] | None = None
    prompt: int = 0
    token_ids: list[int] | None = None
    verify_text: str | None = None


async def _generate(engine, request, cheat=None) -> tuple[str, int, list[int] | None]:
    """The engine's answer to ``request``, its count and token ids; with
    ``cheat`` (``bench.verification.Cheat``), that cheat's (llama.cpp's own
    loop; no ids)."""
    from agent.engines.base import GenerationResult
    from bench.verification import cheat_answer

    if cheat is not None:
        seed = secrets.randbits(31)
        text = await asyncio.to_thread(cheat_answer, engine, request, cheat, seed)
        return text, len(engine.tokenize(text)), None
    result = GenerationResult()
    text = "".join([piece async for piece in engine.stream(request, result)])
    return text, result.completion_tokens, result.token_ids


def _junk(rng: random.Random, words: int = 40) -> str:
    from bench.verification import WORDS

    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


async def _answer(engine, behaviour, messages, temperature, rng, max_tokens):
    from bench.verification import Cheat, request_make
    from jobs.tokens import token_count

    ids = None
    if behaviour == "junk":
        text = _junk(rng)
        count = token_count(engine.model_id, text) or len(text)
    else:
        cheat = {
            "honest": None,
            "hot": Cheat("hot", temperature=temperature + HOT_EXTRA),
            "other": Cheat("other", sigma=OTHER_SIGMA),
        }[behaviour]
        request = request_make(messages, temperature, 1.0, max_tokens, rng.randrange(2**31))
        text, count, ids = await _generate(engine, request, cheat)
    recount = token_count(engine.model_id, text) or 0
    return text, count, recount, ids


async def bank_build(*, prompts: int, per_prompt: int, canaries: int, log=print) -> dict:
    """Generate and score the bank (minutes on 2 cores): real-traffic answers of
    every behaviour at every temperature, and spot-check answers."""
    from agent.engines.llamacpp import LlamaCppEngine
    from bench.verification import request_make
    from jobs.verification.exemptions import verified_text

    engine = LlamaCppEngine(n_ctx=2048)
    await engine.load()
    rng = random.Random(secrets.randbits(64))
    bank: dict = {"traffic": [], "canaries": [], "settings": {
        "hot_extra": HOT_EXTRA, "other_sigma": OTHER_SIGMA, "max_tokens": MAX_TOKENS}}
    try:
        for t in BANK_TEMPERATURES:
            for index, prompt in enumerate(PROMPTS[:prompts]):
                messages = [{"role": "user", "content": prompt}]
                if index % 3 == 0:
                    messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
                for _ in range(per_prompt):
                    for behaviour in BEHAVIOURS:
                        text, count, recount, ids = await _answer(
                            engine, behaviour, messages, t, rng, MAX_TOKENS
                        )
                        # what a verifier is sent of it (the coordinator's rule)
                        verified = verified_text(
                            model_id=engine.model_id, text=text, token_ids=ids, stop=None
                        ).text
                        request = request_make(messages, t, 1.0, MAX_TOKENS, None)
                        scored = await engine.score(request, verified) if verified else None
                        bank["traffic"].append(asdict(Answer(
                            behaviour=behaviour, temperature=t, text=text,
                            completion_tokens=count, recount=recount, prompt=index,
                            scores=[s.frame() for s in scored.tokens] if scored else [],
                            token_ids=ids, verify_text=None if verified == text else verified,
                        )))
            log(f"bank: temperature {t} done ({len(bank['traffic'])} answers)")
        bank["canaries"] = await _canaries_build(engine, canaries, rng, log)
    finally:
        await engine.close()
    return bank


async def _canaries_build(engine, count: int, rng, log) -> list[dict]:
    """Spot checks drawn and calibrated as the pool does, each answered by every
    behaviour: ``{"expected", "distractors", "answers": {behaviour: Answer}}``."""
    from jobs.canaries import answer_right
    from jobs.canarygen import canary_draw
    from jobs.canarypool import shape_default
    from jobs.canaryvocab import vocab_load

    secret = secrets.token_bytes(32)
    vocab = vocab_load("")
    kept, index = [], 0
    while len(kept) < count and index < count * 4:
        index += 1
        draw = canary_draw(
            secret=secret, model_id=engine.model_id, index=index,
            shape=shape_default(rng), vocab=vocab,
        )
        if draw.prompt is not None:
            continue  # the bank's answers are chat
        max_tokens = min(draw.params.get("max_tokens") or 64, 64)
        honest, _, _, _ = await _answer(engine, "honest", draw.messages, 0.0, rng, max_tokens)
        if not answer_right(draw.expected, draw.distractors, honest):
            continue  # calibration: the reference model must answer it right
        answers = {}
        for behaviour in BEHAVIOURS:
            text, n, recount, _ = await _answer(
                engine, behaviour, draw.messages, 0.0, rng, max_tokens
            )
            answers[behaviour] = asdict(Answer(behaviour, 0.0, text, n, recount))
        kept.append({"expected": draw.expected, "distractors": draw.distractors, "answers": answers})
    log(f"bank: {len(kept)} spot checks calibrated of {index} drawn")
    if not kept:
        raise RuntimeError(f"no spot check of {index} drawn was calibrated: ask for more (--canaries)")
    return kept


def bank_load_or_build(path: Path | None, **build) -> dict:
    if path and path.is_file():
        return json.loads(path.read_text())
    from agent.engines.smollm2 import DEFAULT_MODEL_ID
    from jobs.tokens import token_count

    # the coordinator's tokenizer built here, outside the event loop (in it,
    # a tokenizer not yet built is None: catalog.modeldata.model_tokenizer)
    token_count(DEFAULT_MODEL_ID, "warm")
    bank = asyncio.run(bank_build(**build))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(bank))
    return bank
