"""Scoring answers by prefill (``verify`` → ``scores``), with the real model.

The scorer's numbers are judged by the coordinator's pure judge
(``trust.verification.plausibility``) and its receipt checked by the
coordinator's ``billing.receipts``, as the coordinator does with a ``scores``
frame; the cheats' answers come from the calibration program
(``bench.verification``), made by llama.cpp directly.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from agent.engines.base import GenerationError, GenerationRequest, GenerationResult
from bench.verification import Cheat, answers_generate, judge
from trust.verification.plausibility import token_scores_parse

MODEL = "smollm2-135m-instruct"
PROMPT = "Write a short poem about the sea."


def request_of(temperature: float, *, top_p: float = 1.0, max_tokens: int = 48):
    return GenerationRequest(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        params={"temperature": temperature, "top_p": top_p,
                "max_tokens": max_tokens, "seed": 7},
    )  # fmt: skip


async def answer_of(engine: Any, request: GenerationRequest) -> tuple[str, int]:
    text, result = await drawn(engine, request)
    return text, result.completion_tokens


async def drawn(engine: Any, request: GenerationRequest) -> tuple[str, GenerationResult]:
    result = GenerationResult()
    text = "".join([piece async for piece in engine.stream(request, result)])
    return text, result


def verify_frame(job: str, answer: str, **params: Any) -> dict[str, Any]:
    return {
        "type": "verify",
        "job": job,
        "device": 0,
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "params": {"temperature": 0, "top_p": 1, "max_tokens": 48, "stop": None,
                   "seed": 7, **params},
        "answer": answer,
    }  # fmt: skip


@pytest.mark.asyncio
async def test_an_honest_greedy_answer_scores_rank_0_and_is_plausible(
    llama_engine,
) -> None:
    request = request_of(0)
    text, completion_tokens = await answer_of(llama_engine, request)
    scored = await llama_engine.score(request, text)
    assert len(scored.tokens) == completion_tokens > 20
    assert scored.prompt_tokens > 10
    assert [token.rank for token in scored.tokens] == [0] * completion_tokens
    assert all(token.logprob is not None for token in scored.tokens)
    assert all(t.logprob <= 0 and t.mean <= 0 and t.var >= 0 for t in scored.tokens)
    verdict = judge(0, [t.frame() for t in scored.tokens], 48)
    assert verdict.plausible, verdict.detail
    assert verdict.misses == 0 and verdict.outside == 0


@pytest.mark.asyncio
async def test_every_token_sampled_with_top_p_is_in_the_scored_support(
    llama_engine,
) -> None:
    """The support the scorer computes is the one generation samples from:
    an honest answer at temperature 1 with top-p 0.9 has no token outside."""
    request = request_of(1.0, top_p=0.9)
    text, _ = await answer_of(llama_engine, request)
    scored = await llama_engine.score(request, text)
    assert [t for t in scored.tokens if t.logprob is None] == []
    verdict = judge(1.0, [t.frame() for t in scored.tokens], 48)
    assert verdict.plausible, verdict.detail
    assert verdict.misses > 0  # sampled, not greedy: rank 0 is not the rule here


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("asked", "cheat"),
    [(0.0, Cheat("hot", temperature=1.5)), (0.7, Cheat("noisy", sigma=2.0))],
    ids=["hotter-than-asked", "another-model"],
)
async def test_a_cheats_answer_is_implausible(llama_engine, asked, cheat) -> None:
    (answer,) = await answers_generate(
        llama_engine, [PROMPT], asked, cheat, max_tokens=48
    )
    scored = await llama_engine.score(request_of(asked), answer)
    verdict = judge(asked, [t.frame() for t in scored.tokens], 48)
    assert not verdict.plausible, verdict


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", [7, 11, 23])
async def test_a_sampled_answer_is_scored_by_the_tokens_it_drew(llama_engine, seed):
    """Given the host's ids, the verifier scores the tokens sampled: one
    entry per id, each inside the sampler's support (the text tokenized
    again may split otherwise, into tokens the sampler never drew)."""
    request = request_of(0.7, max_tokens=64)
    request.params["seed"] = seed
    text, result = await drawn(llama_engine, request)
    ids = result.token_ids
    assert ids and len(ids) == result.completion_tokens
    scored = await llama_engine.score(request, text, ids)
    assert len(scored.tokens) == len(ids)
    assert [t for t in scored.tokens if t.logprob is None] == []
    verdict = judge(0.7, [t.frame() for t in scored.tokens], 64)
    assert verdict.plausible, verdict.detail


SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "poem",
        "schema": {
            "type": "object",
            "properties": {"title": {"type": "string"}, "lines": {"type": "integer"}},
            "required": ["title", "lines"],
        },
    },
}


@pytest.mark.asyncio
@pytest.mark.parametrize("temperature", [0, 0.7])
async def test_an_answer_under_a_schema_is_scored_under_its_grammar(
    llama_engine, temperature
):
    """A constrained answer's drawn tokens, scored under the same grammar:
    every one inside the support the constrained sampler drew from (rank 0
    at temperature 0), plausible; the same tokens judged without the grammar
    are not what an honest sampler of that distribution draws."""
    request = request_of(temperature, max_tokens=64)
    request.response_format = SCHEMA_FORMAT
    text, result = await drawn(llama_engine, request)
    assert text.startswith("{")
    scored = await llama_engine.score(request, text, result.token_ids)
    assert len(scored.tokens) == len(result.token_ids)
    assert [t for t in scored.tokens if t.logprob is None] == []
    if temperature == 0:
        assert all(t.rank == 0 for t in scored.tokens)
    verdict = judge(temperature, [t.frame() for t in scored.tokens], 64)
    assert verdict.plausible, verdict.detail


@pytest.mark.asyncio
async def test_an_answer_outside_the_schema_scores_outside_the_support(llama_engine):
    """Plain text claimed as a schema's answer: its first token is one the
    grammar forbids, scored outside the support; implausible."""
    plain = request_of(0, max_tokens=32)
    text, result = await drawn(llama_engine, plain)
    claimed = request_of(0, max_tokens=32)
    claimed.response_format = SCHEMA_FORMAT
    scored = await llama_engine.score(claimed, text, result.token_ids)
    assert scored.tokens[0].logprob is None
    verdict = judge(0, [t.frame() for t in scored.tokens], 32)
    assert not verdict.plausible


@pytest.mark.asyncio
async def test_a_token_id_outside_the_vocabulary_is_an_error(llama_engine) -> None:
    with pytest.raises(GenerationError, match="not in the vocabulary"):
        await llama_engine.score(request_of(0), "x", [1, 10**9])


@pytest.mark.asyncio
async def test_scoring_stops_at_max_tokens(llama_engine) -> None:
    text, _ = await answer_of(llama_engine, request_of(0))
    scored = await llama_engine.score(request_of(0, max_tokens=5), text)
    assert len(scored.tokens) == 5


@pytest.mark.asyncio
async def test_a_verify_frame_is_answered_by_scores_with_a_receipt(
    coordinator, agent_start, llama_engine
) -> None:
    from billing.receipts import receipt_verify

    text, completion_tokens = await answer_of(llama_engine, request_of(0))
    await agent_start(coordinator, engine=llama_engine)
    hello = coordinator.hellos[0]
    assert hello["verifies"] is True
    await coordinator.send(verify_frame("v1", text))
    scores = await coordinator.expect("scores", timeout=60, job="v1")  # no claim
    assert set(scores) == {"type", "job", "tokens", "usage", "receipt"}
    count = scores["usage"]["completion_tokens"]
    assert count == len(scores["tokens"]) == completion_tokens
    assert scores["usage"]["prompt_tokens"] > 10
    tokens = token_scores_parse(scores["tokens"], max_tokens=48)
    assert all(token.rank == 0 for token in tokens)
    assert all(math.isfinite(token.mean) for token in tokens)
    assert receipt_verify(
        public_key_b64=hello["public_key"],
        signature_b64=scores["receipt"],
        job="v1",
        completion_tokens=count,
        text=text,
    )
    await coordinator.receive_nothing()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"answer": None}, "answer must be a string"),
        ({"params": {"max_tokens": "48"}}, "params.max_tokens must be an integer"),
        ({"messages": "hi"}, "messages must be a list of objects"),
        ({"model": ""}, "without a model"),
        ({"device": 3}, "device 3 is not served here"),
        ({"token_ids": [1, -2]}, "token_ids must be a list"),
        ({"token_ids": "1 2"}, "token_ids must be a list"),
        ({"token_ids": [1, True]}, "token_ids must be a list"),
    ],
)
async def test_a_malformed_verify_is_refused_naming_the_field(
    coordinator, agent_start, change, named
) -> None:
    await agent_start(coordinator)
    await coordinator.send({**verify_frame("bad", "4"), **change})
    error = await coordinator.expect("error", job="bad")
    assert error["message"].startswith("verify: ") and named in error["message"]


@pytest.mark.asyncio
async def test_an_engine_that_cannot_score_refuses_verify(
    coordinator, agent_start
) -> None:
    await agent_start(coordinator)  # the scripted engine
    assert "verifies" not in coordinator.hellos[0]
    await coordinator.send(verify_frame("v2", "2 + 2 = 4"))
    error = await coordinator.expect("error", job="v2")
    assert "cannot score" in error["message"]
