"""``response_format: json_sequence`` (a model's own tool-call format) on the
real model (SmolLM2-135M-Instruct, llama.cpp in process): the answer is
documents of the schema between the literals, also across a continuation
from a cut in a literal or a document; with ``text_unless``, any text that
does not begin with it instead; a malformed offer is refused by name."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from agent.engines.base import GenerationError, GenerationRequest, GenerationResult
from agent.engines.constrained import GrammarMask, sequence_grammar
from agent.frames import response_format_check

MODEL = "smollm2-135m-instruct"
WEATHER = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
HERMES = {
    "name": "tool_calls",
    "schema": WEATHER,
    "prefix": "<tool_call>\n",
    "suffix": "\n</tool_call>",
    "separator": "\n",
    "min_items": 1,
    "max_items": 2,
}


def sequence(**spec: Any) -> dict[str, Any]:
    return {"type": "json_sequence", "json_sequence": {**HERMES, **spec}}


def documents(text: str, spec: dict[str, Any]) -> list[Any]:
    """The documents of a sequence ``text`` (literals around each), each
    checked against the schema (AssertionError when it is not that sequence)."""
    prefix, suffix = spec["prefix"], spec["suffix"]
    assert text.startswith(prefix) and text.endswith(suffix), text
    inner = text[len(prefix) : len(text) - len(suffix)]
    out = [
        json.loads(body) for body in inner.split(suffix + spec["separator"] + prefix)
    ]
    for value in out:
        jsonschema.validate(value, spec["schema"])
    assert spec["min_items"] <= len(out) <= spec["max_items"], text
    return out


async def generate(
    engine: Any, response_format: dict, **fields: Any
) -> tuple[str, GenerationResult]:
    request = GenerationRequest(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        params={"temperature": 0, "max_tokens": 120} | fields.pop("params", {}),
        response_format=response_format,
        **fields,
    )
    result = GenerationResult()
    text = "".join([piece async for piece in engine.stream(request, result)])
    return text, result


@pytest.mark.asyncio
async def test_the_answer_is_documents_between_the_literals(llama_engine) -> None:
    for params in ({"temperature": 0}, {"temperature": 0.9, "seed": 3}):
        text, result = await generate(llama_engine, sequence(), params=params)
        assert result.finish_reason == "stop", text
        assert documents(text, HERMES)[0]["name"] == "get_weather"


@pytest.mark.asyncio
async def test_a_continuation_from_any_cut_still_is_the_sequence(llama_engine) -> None:
    """Cut in the prefix, in the JSON and in the suffix: prefix and
    continuation together are the sequence (the grammar is advanced over the
    delivered text)."""
    answer, _ = await generate(llama_engine, sequence())
    documents(answer, HERMES)
    for cut in (5, len("<tool_call>\n{") + 3, answer.index("</tool_call>") + 4):
        prefix = answer[:cut]
        rest, result = await generate(llama_engine, sequence(), continue_from=prefix)
        assert result.finish_reason == "stop", (prefix, rest)
        documents(prefix + rest, HERMES)


@pytest.mark.asyncio
async def test_a_verifier_scores_the_answer_under_the_same_grammar(
    llama_engine,
) -> None:
    """Prefill under the sequence's grammar: every drawn token inside the
    support, the greedy choice at temperature 0."""
    text, result = await generate(llama_engine, sequence())
    request = GenerationRequest(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        params={"temperature": 0, "max_tokens": 120},
        response_format=sequence(),
    )
    scored = await llama_engine.score(request, text, result.token_ids)
    assert len(scored.tokens) == len(result.token_ids)
    assert all(t.logprob is not None and t.rank == 0 for t in scored.tokens)


@pytest.mark.asyncio
async def test_a_continuation_the_sequence_cannot_have_is_refused(llama_engine) -> None:
    with pytest.raises(GenerationError, match="continue_from"):
        await generate(llama_engine, sequence(), continue_from="<tool_call>\n[")


def _allows(engine: Any, spec: dict[str, Any], text: str) -> bool:
    llama = engine._llama
    mask = GrammarMask(engine._vocab, sequence_grammar(spec), llama.n_vocab())
    try:
        mask.advance(llama.tokenize(text.encode(), add_bos=False, special=False))
    except GenerationError:
        return False
    finally:
        mask.close()
    return True


@pytest.mark.parametrize(
    "text, allowed",
    [
        ("Sunny, 20 degrees.", True),
        ("<tool_cal", True),  # may still become a call
        ("<tool_call>\n", True),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            True,
        ),
        ("<tool_call>\nSunny", False),  # begins as a call: must be one
        ('<tool_call>\n{"name": "now"', False),
        # a raw control character inside a JSON string: no JSON (fresh-eyes
        # review 3: the converter let one through, the arguments did not parse)
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\nris', False),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\tris', False),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\nris', True),
    ],
)
def test_text_unless_allows_any_text_that_does_not_begin_as_a_call(
    llama_engine, text, allowed
) -> None:
    spec = {**HERMES, "text_unless": "<tool_call>\n"}
    assert _allows(llama_engine, spec, text) is allowed


def test_a_bare_document_sequence_is_one_json_object(llama_engine) -> None:
    """Llama 3.1's layout: no literals, one call, or text not beginning with ``{``."""
    spec = {
        **HERMES,
        "prefix": "",
        "suffix": "",
        "separator": "",
        "max_items": 1,
        "text_unless": "{",
    }
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert _allows(llama_engine, spec, call)
    assert _allows(llama_engine, spec, "It is sunny {really}")
    assert not _allows(llama_engine, spec, call + call)
    assert not _allows(llama_engine, spec, '{"city": "Oslo"}')


@pytest.mark.parametrize(
    "value",
    [
        {"type": "json_sequence"},
        {"type": "json_sequence", "json_sequence": {"schema": True}},
        sequence(prefix=5),
        sequence(min_items=-1),
        sequence(min_items=2, max_items=1),
        sequence(max_items=0),
        sequence(text_unless=""),
        {"type": "grammar", "grammar": "root ::= x"},
    ],
)
def test_a_malformed_sequence_is_refused(value) -> None:
    with pytest.raises(ValueError, match="response_format"):
        response_format_check(value)


def test_a_well_formed_sequence_is_taken() -> None:
    response_format_check(sequence())
    response_format_check(sequence(max_items=None, text_unless="<tool_call>\n"))
