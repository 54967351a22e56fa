"""The answers of ``bench/trust.py``'s hosts, written by the real model.

For a set of real-traffic prompts at temperatures 0, 0.7 and 1, each host
behaviour's answer is generated with a real model (``BENCH_MODELS``:
SmolLM2-135M-Instruct Q4_1, or the second family's tiny Llama 3 of
``tests/models/build.py``) through the agent's llama.cpp engine and scored by
prefill on that engine (``Engine.score``: what a verifying device returns in
its ``scores`` frame); for spot checks, prompts drawn by the coordinator's
generator (``trust.canarygen``, an unknown secret) and calibrated as the pool
calibrates them (the model must answer them right: the tiny model's random
weights answer none, so its bank has no spot check), answered by each
behaviour.

Behaviours (what a host does; nothing here knows what catches it):

- ``honest``: the engine, the request's parameters;
- ``hot``: the engine at the asked temperature + ``HOT_EXTRA`` (b);
- ``other``: the reference model with Gaussian noise of ``OTHER_SIGMA`` added to
  its logits before sampling, the request's parameters (c; σ 1 is the case a
  single verification catches least often: docs/trust.md);
- ``junk``: random English words (a);
- ``inflate``: the honest answer, its token ids split finer than the sampler
  drew them (``INFLATE`` more: a host claiming splits to raise its count,
  ids that still spell the text) (d);
- ``fffd``: the junk answer with a U+FFFD planted after its first word, ids
  that spell it as a character the model cut (a lone UTF-8 lead byte's token:
  the best a host can fake) (h);
- ``q4_0`` (SmolLM2 only): the same model requantized to Q4_0 by llama.cpp
  (``tests/models/build.smollm2_q4_0``), its engine's own answers and ids,
  the request's parameters: a host declaring the Q4_1 digest while running
  cheaper weights (j).

Real traffic is plain text, and for ``CONSTRAINED`` prompts a
``response_format: json_schema`` answer (honest and inflate: a grammar's
splits are where a count check cannot expect the canonical one). Each entry
keeps what the host sends (text, ``token_ids``, its count) and what a
verifier returns for what the coordinator sends it (``verified_text``: the
text and, when they spell it, the host's ids, scored under the grammar).

The cheats' answers come from llama.cpp's own generate loop
(``bench.verification.cheat_answer``), none of the agent's generation code.

The bank is kept as JSON (``--bank FILE``) so the fleet can be rerun without the
model.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.trustmodels import SMOLLM2, model_catalogued, model_file

HOT_EXTRA = 1.0
OTHER_SIGMA = 1.0
MAX_TOKENS = 48
GENERATED = ("honest", "hot", "other", "junk")
"""The behaviours that write their own text; ``inflate`` and ``fffd`` alter
``honest``'s and ``junk``'s."""
BEHAVIOURS = (*GENERATED, "inflate", "fffd")
INFLATE = 1.15
"""The inflate cheat's count: its ids number this many times the honest ones."""
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
_PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "city"],
}  # fmt: skip
_LIST = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string"}}},
    "required": ["items"],
}
_VERDICT = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no", "unsure"]},
        "reason": {"type": "string"},
    },
    "required": ["answer", "reason"],
}
CONSTRAINED = [
    ("Invent a character for a novel and describe them.", _PERSON),
    ("Describe your favourite teacher.", _PERSON),
    ("List three fruits that are red.", _LIST),
    ("What should I pack for a beach day?", _LIST),
    ("Is the moon bigger than the earth?", _VERDICT),
    ("Can penguins fly?", _VERDICT),
]
"""Prompts answered under a ``response_format: json_schema`` (of the subset
renters may send), ``CONSTRAINED_ANSWERS`` times as many answers each as a
plain prompt (honest ones only: they are where a false flag would show)."""
CONSTRAINED_ANSWERS = 3


@dataclass
class Answer:
    """One answer: ``text``; ``completion_tokens`` the host's count;
    ``recount`` the coordinator's (``jobs.tokens.token_count``);
    ``token_ids`` the ids the host sends (``done.token_ids``: the honest
    engine's, a cheat's claim; None for the cheats' own loops);
    ``constrained`` whether it was asked under ``response_format``; what a
    verifier is sent of it (``verify_text``, None: ``text`` whole, with the
    ``exemption`` that left the rest out;
    ``verify_ids`` the ids when the coordinator sends them) and its ``scores``
    frame entries for that (None for a spot check's)."""

    behaviour: str
    temperature: float
    text: str
    completion_tokens: int
    recount: int
    scores: list[dict] | None = None
    prompt: int = 0
    token_ids: list[int] | None = None
    verify_text: str | None = None
    verify_ids: list[int] | None = None
    constrained: bool = False
    exemption: str = ""


def response_format(schema: dict) -> dict:
    """The ``response_format`` a renter sends for ``schema``."""
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


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


def _request(model_id, messages, temperature: float, schema: dict | None, seed: int | None):
    from dataclasses import replace

    from bench.verification import request_make

    request = request_make(messages, temperature, 1.0, MAX_TOKENS, seed)
    return replace(
        request, model=model_id, response_format=response_format(schema) if schema else None
    )


async def _answer(
    engine, behaviour, messages, temperature, rng, max_tokens, schema=None, cheaper=None
):
    """(text, the host's count, ids) of a plain behaviour (honest, hot, other,
    junk, q4_0: ``cheaper``'s honest answer)."""
    from dataclasses import replace

    from bench.verification import Cheat
    from jobs.tokens import token_count

    if behaviour == "junk":
        text = _junk(rng)
        return text, token_count(engine.model_id, text) or len(text), None
    if behaviour == "q4_0":
        engine, behaviour = cheaper, "honest"
    cheat = {
        "honest": None,
        "hot": Cheat("hot", temperature=temperature + HOT_EXTRA),
        "other": Cheat("other", sigma=OTHER_SIGMA),
    }[behaviour]
    request = _request(engine.model_id, messages, temperature, schema, rng.randrange(2**31))
    request = replace(request, params={**request.params, "max_tokens": max_tokens})
    return await _generate(engine, request, cheat)


def _inflated(model_id: str, ids: list[int], rng: random.Random) -> list[int]:
    """``ids`` with tokens split in two where the vocabulary has both halves,
    until they number ``INFLATE`` times as many (or no token splits): the
    same text, a count a sampler would not draw."""
    from jobs.tokens import token_pieces

    index, _ = _pieces_index(model_id)
    pieces = token_pieces(model_id)
    want = max(1, round(len(ids) * (INFLATE - 1)))
    out = list(ids)
    for at in rng.sample(range(len(ids)), len(ids)):
        if want == 0:
            break
        piece = pieces[ids[at]]
        for cut in range(1, len(piece)):
            head, tail = index.get(piece[:cut]), index.get(piece[cut:])
            if head is not None and tail is not None:
                out[at] = (head, tail)
                want -= 1
                break
    return [t for x in out for t in (x if isinstance(x, tuple) else (x,))]


def _planted(model_id: str, text: str) -> tuple[str, list[int]]:
    """(``text`` with a U+FFFD after its first word, token ids that spell it
    as the model's own cut character: tokens of the text around a lone UTF-8
    lead byte's token), the ``fffd`` cheat's answer."""
    from jobs.tokens import token_pieces

    cut = text.find(" ", 1) if " " in text[1:] else len(text)
    before, after = text[:cut], text[cut:]
    lead = token_pieces(model_id).index(b"\xe4")
    ids = _ids_spelling(model_id, before.encode()) + [lead]
    return before + "\ufffd" + after, ids + _ids_spelling(model_id, after.encode())


@functools.lru_cache(maxsize=2)
def _pieces_index(model_id: str) -> tuple[dict[bytes, int], int]:
    from jobs.tokens import token_pieces

    pieces = token_pieces(model_id)
    index = {piece: token for token, piece in enumerate(pieces) if piece}
    return index, max(map(len, index))


def _ids_spelling(model_id: str, raw: bytes) -> list[int]:
    """Token ids whose bytes joined are ``raw``: the longest token at each
    point (a byte-level vocabulary has every single byte), as a host may
    claim its sampler drew them."""
    index, longest = _pieces_index(model_id)
    ids, at = [], 0
    while at < len(raw):
        for size in range(min(longest, len(raw) - at), 0, -1):
            token = index.get(raw[at : at + size])
            if token is not None:
                ids.append(token)
                at += size
                break
        else:
            raise ValueError(f"no token for byte {raw[at]:#x}")
    return ids


async def _entry(engine, request, *, behaviour, temperature, prompt, text, count, ids) -> dict:
    """One bank entry: what the host sends, and the scores a verifier returns
    for what the coordinator sends it (``verified_text``, its ids when they
    number no more than ``max_tokens``, scored under the request's grammar)."""
    from jobs.tokens import token_count
    from trust.verification.exemptions import verified_text

    verified = verified_text(model_id=engine.model_id, text=text, token_ids=ids, stop=None)
    sent = verified.token_ids
    if sent is not None and len(sent) > MAX_TOKENS:
        sent = None
    scored = (
        await engine.score(request, verified.text, token_ids=sent) if verified.text else None
    )
    return asdict(Answer(
        behaviour=behaviour, temperature=temperature, text=text, completion_tokens=count,
        recount=token_count(engine.model_id, text) or 0, prompt=prompt,
        scores=[s.frame() for s in scored.tokens] if scored else [], token_ids=ids,
        verify_text=None if verified.text == text else verified.text, verify_ids=sent,
        constrained=request.response_format is not None, exemption=verified.exemption,
    ))  # fmt: skip


def _traffic_prompts(prompts: int) -> list[tuple[int, list[dict], dict | None]]:
    """(index, messages, schema or None): ``prompts`` plain prompts (a third
    with a system message), then the ``CONSTRAINED`` ones (index from 100)."""
    out = []
    for index, prompt in enumerate(PROMPTS[:prompts]):
        messages = [{"role": "user", "content": prompt}]
        if index % 3 == 0:
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        out.append((index, messages, None))
    for index, (prompt, schema) in enumerate(CONSTRAINED):
        out.append((100 + index, [{"role": "user", "content": prompt}], schema))
    return out


def prompt_messages(prompt: int) -> list[dict]:
    """The user message of the bank's prompt number ``prompt``."""
    text = PROMPTS[prompt] if prompt < 100 else CONSTRAINED[prompt - 100][0]
    return [{"role": "user", "content": text}]


def prompt_schema(prompt: int) -> dict | None:
    return None if prompt < 100 else CONSTRAINED[prompt - 100][1]


async def bank_build(
    *, prompts: int, per_prompt: int, canaries: int, model_id: str = SMOLLM2, log=print
) -> dict:
    """Generate and score the bank of ``model_id`` (minutes on 2 cores):
    real-traffic answers of every behaviour at every temperature
    (constrained ones: honest and inflate), and spot-check answers; for
    SmolLM2 the requantized file's answers (``q4_0``) too."""
    from agent.engines.llamacpp import LlamaCppEngine

    path = model_file(model_id)
    cheaper_too = model_id == SMOLLM2
    engine = LlamaCppEngine(model=model_id, model_path=path, n_ctx=2048 if cheaper_too else 512)
    await engine.load()
    cheaper = None
    if cheaper_too:
        from tests.models.build import smollm2_q4_0

        cheaper = LlamaCppEngine(model=model_id, model_path=smollm2_q4_0(), n_ctx=2048)
        await cheaper.load()
    generated = (*GENERATED, "q4_0") if cheaper else GENERATED
    rng = random.Random(secrets.randbits(64))
    bank: dict = {"model": model_id, "traffic": [], "canaries": [], "settings": {
        "hot_extra": HOT_EXTRA, "other_sigma": OTHER_SIGMA, "max_tokens": MAX_TOKENS,
        "inflate": INFLATE}}
    model = engine.model_id
    try:
        for t in BANK_TEMPERATURES:
            for index, messages, schema in _traffic_prompts(prompts):
                request = _request(model, messages, t, schema, None)
                plain = generated if schema is None else ("honest",)
                for _ in range(per_prompt * (1 if schema is None else CONSTRAINED_ANSWERS)):
                    for behaviour in plain:
                        text, count, ids = await _answer(
                            engine, behaviour, messages, t, rng, MAX_TOKENS, schema, cheaper
                        )
                        kinds = [(behaviour, text, ids, count)]
                        if behaviour == "honest" and ids:
                            finer = _inflated(model, ids, rng)
                            kinds.append(("inflate", text, finer, len(finer)))
                        if behaviour == "junk":
                            planted, planted_ids = _planted(model, text)
                            kinds.append(("fffd", planted, planted_ids, len(planted_ids)))
                        for kind, answer, answer_ids, reported in kinds:
                            bank["traffic"].append(await _entry(
                                engine, request, behaviour=kind, temperature=t, prompt=index,
                                text=answer, count=reported, ids=answer_ids,
                            ))  # fmt: skip
            log(f"bank: temperature {t} done ({len(bank['traffic'])} answers)")
        bank["canaries"] = await _canaries_build(engine, canaries, rng, log, cheaper)
    finally:
        await engine.close()
        if cheaper is not None:
            await cheaper.close()
    return bank


async def _canaries_build(engine, count: int, rng, log, cheaper=None) -> list[dict]:
    """Spot checks drawn and calibrated as the pool does, each answered by every
    behaviour: ``{"expected", "distractors", "answers": {behaviour: Answer}}``."""
    from trust.canaries import answer_right
    from trust.canarygen import canary_draw
    from trust.canarypool import shape_default
    from trust.canaryvocab import vocab_load
    from jobs.tokens import token_count

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
        honest, _, _ = await _answer(engine, "honest", draw.messages, 0.0, rng, max_tokens)
        if not answer_right(draw.expected, draw.distractors, honest):
            continue  # calibration: the reference model must answer it right
        answers = {}
        for behaviour in (*GENERATED, "q4_0") if cheaper else GENERATED:
            text, n, _ = await _answer(
                engine, behaviour, draw.messages, 0.0, rng, max_tokens, None, cheaper
            )
            recount = token_count(engine.model_id, text) or 0
            answers[behaviour] = asdict(Answer(behaviour, 0.0, text, n, recount))
        kept.append({"expected": draw.expected, "distractors": draw.distractors, "answers": answers})
    log(f"bank: {len(kept)} spot checks calibrated of {index} drawn"
        + ("" if kept else ": the model answers none right, its fleet gets no spot check"))
    return kept


def bank_load_or_build(path: Path | None, *, model_id: str = SMOLLM2, **build) -> dict:
    """The bank of ``model_id`` kept at ``path``, else built (and kept)."""
    model_catalogued(model_id)
    from jobs.tokens import token_count

    # the coordinator's tokenizer built here, outside the event loop (in it,
    # a tokenizer not yet built is None: catalog.modeldata.model_tokenizer)
    token_count(model_id, "warm")
    if path and path.is_file():
        return json.loads(path.read_text())
    bank = asyncio.run(bank_build(model_id=model_id, **build))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(bank))
    return bank
