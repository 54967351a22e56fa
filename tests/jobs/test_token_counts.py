"""The token sanity check against what the real model produces (DESIGN.md
"Money": billed = min(reported, recount); a count that is not believable is a
failed check of the device's honesty).

The tolerance (``jobs.tokens.token_count_inflated``: max(2, 5 %) over the
recount) must pass every honest count of the reference model, sampled answers
included, and flag a host that inflates its counts by 15 %.
"""

from __future__ import annotations

import asyncio

import pytest

from jobs.services.segments import segment_tokens
from jobs.tokens import token_count, token_count_inflated, token_ids_held, token_pieces

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three uses of copper.",
    "Tell me a story about a dragon who loved tea.",
    "Why is the sky blue?",
    "Write Python code that reverses a list.",
]


@pytest.fixture(scope="module")
def honest_answers():
    """(text, completion_tokens) of the real engine at temperatures 0, 0.8, 1.2."""
    from agent.engines.base import GenerationRequest, GenerationResult
    from agent.engines.llamacpp import LlamaCppEngine

    async def generate():
        engine = LlamaCppEngine(n_ctx=1024)
        await engine.load()
        answers = []
        try:
            for seed, temperature in enumerate((0.0, 0.8, 1.2)):
                for prompt in PROMPTS:
                    request = GenerationRequest(
                        model=engine.model_id,
                        messages=[{"role": "user", "content": prompt}],
                        params={"max_tokens": 96, "temperature": temperature, "seed": seed},
                    )
                    result = GenerationResult()
                    text = ""
                    async for piece in engine.stream(request, result):
                        text += piece if isinstance(piece, str) else piece.text
                    answers.append((text, result.completion_tokens))
        finally:
            await engine.close()
        return answers

    return asyncio.run(generate())


def test_honest_counts_of_the_real_model_are_believable(honest_answers, catalog):
    for text, reported in honest_answers:
        recount = token_count(catalog.id, text)
        assert recount is not None
        assert not token_count_inflated(reported=reported, text=text, recount=recount), (
            text,
            reported,
            recount,
        )


def test_a_count_inflated_by_15_percent_is_flagged(honest_answers, catalog):
    flagged = 0
    long_answers = [(t, n) for t, n in honest_answers if n >= 14]
    assert long_answers
    for text, reported in long_answers:
        inflated = reported * 115 // 100
        recount = token_count(catalog.id, text)
        flagged += token_count_inflated(reported=inflated, text=text, recount=recount)
    assert flagged == len(long_answers)


def test_the_tolerance_at_its_edges():
    assert not token_count_inflated(reported=12, text="x" * 100, recount=10)
    assert token_count_inflated(reported=13, text="x" * 100, recount=10)
    assert not token_count_inflated(reported=105, text="x" * 400, recount=100)
    assert token_count_inflated(reported=106, text="x" * 400, recount=100)
    # never more tokens than characters, even without a tokenizer
    assert token_count_inflated(reported=5, text="abcd", recount=None)
    assert not token_count_inflated(reported=4, text="abcd", recount=None)


def test_token_ids_that_spell_the_text_are_held_to_the_recount_where_a_split_is_canonical():
    # a host claiming finer splits than its sampler draws (ids that do spell the
    # text: "a", "b", … one by one) on plain text is flagged as it is without ids
    assert token_count_inflated(
        reported=30, text="x" * 100, recount=20, spelled=True, canonical=True
    )
    assert not token_count_inflated(
        reported=22, text="x" * 100, recount=20, spelled=True, canonical=True
    )
    # a grammar's or a hot sampler's split is the model's: believed when spelled
    assert not token_count_inflated(
        reported=30, text="x" * 100, recount=20, spelled=True, canonical=False
    )
    # a character drawn byte by byte: more tokens than characters, spelled
    assert not token_count_inflated(
        reported=4, text="😀", recount=4, spelled=True, canonical=True
    )
    assert token_count_inflated(reported=4, text="😀", recount=4)
    # ids that do not spell the text are a false count past the recount;
    # at or under it they gain nothing (billing takes the smaller): the
    # host's loss, not a cheat (an honest agent once reported 0 ids for a
    # token whose text it had sent)
    assert token_count_inflated(
        reported=21, text="x" * 100, recount=20, spelled=False, canonical=False
    )
    assert not token_count_inflated(
        reported=20, text="x" * 100, recount=20, spelled=False, canonical=False
    )
    assert not token_count_inflated(
        reported=0, text="\n" + " " * 12, recount=1, spelled=False, canonical=True
    )


@pytest.mark.django_db
def test_a_character_cut_by_max_tokens_is_no_finer_split(catalog):
    """An honest greedy answer cut by ``max_tokens`` inside a 4-byte character
    drawn byte by byte: the agent holds back its first bytes and counts their
    tokens. Those tokens spell no text sent, so they are left out of the
    count compared with the recount (fresh-eyes review 3: 'Hi 𓀀' and three
    bytes of '𓀁', 9 ids for a recount of 6, was flagged). A finer split of
    the text itself still is."""
    pieces = token_pieces(catalog.id)

    def ids(*parts: bytes) -> list[int]:
        return [pieces.index(part) for part in parts]

    glyph, cut = "𓀀".encode(), "𓀁".encode()[:3]
    text = "Hi 𓀀"
    honest = ids(b"Hi", b" ", *(glyph[i : i + 1] for i in range(4)))
    honest += ids(*(cut[i : i + 1] for i in range(3)))
    assert token_ids_held(catalog.id, ids=honest, text=text) == 3
    recount = token_count(catalog.id, text)
    assert len(honest) - recount > 2  # the tolerance alone would flag it
    billed, flagged = segment_tokens(
        model_id=catalog.id, text=text, reported=len(honest), token_ids=honest, budget=9
    )
    assert not flagged and billed <= recount
    # the text itself split finer, the same cut character after it: flagged
    longer = text + " x y z w"
    finer = ids(b"H", b"i", b" ", *(glyph[i : i + 1] for i in range(4)))
    finer += ids(b" ", b"x", b" ", b"y", b" ", b"z", b" ", b"w")
    finer += ids(*(cut[i : i + 1] for i in range(3)))
    assert len(finer) - 3 - token_count(catalog.id, longer) > 2
    assert segment_tokens(
        model_id=catalog.id, text=longer, reported=len(finer), token_ids=finer
    )[1]
