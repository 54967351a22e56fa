"""No exemption from verification on the host's word (issue 32 item 3;
DESIGN.md "Verifying real answers"): what is left out of a verified answer is
what the coordinator sees in the host's own token ids (``done.token_ids``)
decoded with the model's vocabulary (``trust.verification.exemptions``): the
last token a renter's ``stop`` sequence cut, bytes the model drew that are no
character. A ``finish_reason`` ``stop`` or a U+FFFD the host wrote exempts
nothing.

Scripted hosts over the real websocket; the ids are the reference model's
vocabulary's (the catalog's data).
"""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from jobs.models import Attempt, Verification
from jobs.tokens import token_pieces
from tests.hostsim import MODEL
from tests.jobs.helpers import chat_request
from trust.verification.exemptions import verified_text

from .verifying import (  # noqa: F401 (verifying: a fixture)
    PLAUSIBLE,
    host_online,
    scores_of,
    served,
    verification_until,
    verified_and_verifier,
    verify_to,
    verifying,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _ids(*parts: str | bytes) -> list[int]:
    """The ids of the model's tokens that are each of ``parts`` (text, or raw
    bytes: a lone byte's token), in order: token ids a host's sampler could
    have drawn."""
    pieces = token_pieces(MODEL)
    return [
        pieces.index(part if isinstance(part, bytes) else part.encode())
        for part in parts
    ]


HELLO = ("Hello", " there", ",", " how", " can", " I", " help", "?")
JSON_ANSWER = tuple('{"a":"hi"}')
LEAD_BYTE = b"\xe4"  # a CJK character's first byte, never finished here


async def _answered(api_key, host, *, pieces, ids, finish_reason="stop", **params):
    """A renter's non-streamed chat answered by ``host`` with ``pieces`` and a
    ``done`` carrying ``ids`` as its ``token_ids``; returns the attempt."""
    request = chat_request(api_key, stream=False, **params)
    offer = await host.recv_type("offer")
    job = offer["job"]
    await host.claim(job)
    for piece in pieces:
        await host.token(job, piece)
    await host.send(
        {
            "type": "done",
            "job": job,
            "finish_reason": finish_reason,
            "usage": {"prompt_tokens": 10, "completion_tokens": len(ids)},
            "receipt": host.receipt(job, len(ids)),
            "token_ids": ids,
        }
    )
    response = await request
    assert response.status_code == 200, response.content
    return await Attempt.objects.aget(id=job)


async def _verified_as(verifier, expected: str, ids: list[int] | None = None) -> Verification:
    """The ``verify`` the verifier gets carries ``expected`` as the answer and
    ``ids`` as its ``token_ids`` (none when None); scored plausible, it ends
    plausible."""
    _, verify = await verify_to([verifier])
    assert verify["answer"] == expected
    assert verify.get("token_ids") == ids
    assert verify["params"]["stop"] is None
    await verifier.send(verifier.scores_frame(verify, scores_of(verify, PLAUSIBLE)))
    return await verification_until(verify["job"])


@pytest.mark.asyncio
async def test_it_verifies_a_stop_answer_whole_when_the_ids_show_no_cut(
    verifying, api_key
):
    """A host saying ``finish_reason`` ``stop`` under a ``stop`` list whose ids
    end where its text ends cut nothing: verified whole (was never verified)."""
    verified, verifier = await verified_and_verifier()
    text = "Hello there, how can I help?"
    ids = await database_sync_to_async(_ids)(*HELLO)
    attempt = await _answered(
        api_key, verified, pieces=[text], ids=ids, stop=["\n"], temperature=1.0
    )
    assert (attempt.exemption, attempt.verify_text) == ("", None)
    ver = await _verified_as(verifier, text, ids)
    assert ver.verdict == "plausible"
    await verified.close()
    await verifier.close()


@pytest.mark.asyncio
async def test_it_verifies_the_whole_tokens_before_a_stop_sequence_cut(
    verifying, api_key
):
    """``stop: ["ow"]`` cut the last token " how" after its "h": the ids run on
    past the answer by what the stop sequence starts with, so the verifier
    scores the text of the tokens before it (the model drew them whole)."""
    verified, verifier = await verified_and_verifier()
    ids = await database_sync_to_async(_ids)(*HELLO[:4])
    attempt = await _answered(
        api_key, verified, pieces=["Hello there, h"], ids=ids, stop=["ow"], temperature=1.0
    )
    assert (attempt.exemption, attempt.verify_text) == ("stop_cut", "Hello there,")
    await _verified_as(verifier, "Hello there,", ids[:-1])  # the drawn tokens scored
    await verified.close()
    await verifier.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("stop", [["e"], ["zz"]])
async def test_a_stop_the_coordinator_cannot_see_exempts_nothing(verifying, api_key, stop):
    """No ids (the host's word alone: ``finish_reason`` ``stop`` under a
    ``stop`` list), or ids whose run-on text no ``stop`` string begins: the
    answer is verified whole as delivered (was never verified)."""
    verified, verifier = await verified_and_verifier()
    if stop == ["e"]:
        await served(api_key, verified, stop=stop, temperature=1.0)
        await _verified_as(verifier, "Hello there, how can I help?")
    else:
        ids = await database_sync_to_async(_ids)(*HELLO[:4])
        attempt = await _answered(
            api_key, verified, pieces=["Hello there, h"], ids=ids, stop=stop
        )
        assert (attempt.exemption, attempt.verify_text) == ("", None)
        await _verified_as(verifier, "Hello there, h")  # (the ids run on: text)
    await verified.close()
    await verifier.close()


@pytest.mark.asyncio
async def test_a_ufffd_the_host_wrote_is_verified_as_written(verifying, api_key):
    """U+FFFD in an answer whose host sent no ids to show a cut character:
    text the host wrote, verified as it is (was never verified: a host
    dodged every verification with one U+FFFD)."""
    verified, verifier = await verified_and_verifier()
    request = chat_request(api_key, stream=False)
    offer = await verified.recv_type("offer")
    await verified.answer(offer, ["Hello \ufffd there"])
    assert (await request).status_code == 200
    await _verified_as(verifier, "Hello \ufffd there")
    await verified.close()
    await verifier.close()


@pytest.mark.asyncio
async def test_a_character_the_model_cut_is_left_out_of_what_is_verified(
    verifying, api_key
):
    """Ids with a lone UTF-8 lead byte's token before " there": the agent's
    decoder made it U+FFFD, bytes no text can carry to the verifier; it is
    left out and the rest verified."""
    verified, verifier = await verified_and_verifier()
    ids = await database_sync_to_async(_ids)("Hello", LEAD_BYTE, " there")
    attempt = await _answered(
        api_key, verified, pieces=["Hello\ufffd there"], ids=ids, temperature=1.0
    )
    assert (attempt.exemption, attempt.verify_text) == ("cut_character", "Hello there")
    await _verified_as(verifier, "Hello there", ids)  # the byte the model drew is scored
    await verified.close()
    await verifier.close()


def test_a_ufffd_the_ids_spell_as_its_own_bytes_is_text(catalog):
    """The model may draw U+FFFD's own bytes (EF BF BD): that is its text,
    verified as such; a cut only where an invalid sequence ends at a token
    boundary."""
    text = "Hello \ufffd there"
    own_bytes = _ids("Hello", " ", b"\xef", b"\xbf", b"\xbd", " there")
    whole = verified_text(model_id=MODEL, text=text, token_ids=own_bytes, stop=None)
    assert (whole.text, whole.exemption) == (text, "")
    cut = verified_text(
        model_id=MODEL,
        text=text,
        token_ids=_ids("Hello", " ", LEAD_BYTE, " there"),
        stop=None,
    )
    assert (cut.text, cut.exemption) == ("Hello  there", "cut_character")


@pytest.mark.asyncio
async def test_a_verifier_must_score_one_entry_per_token_id(verifying, api_key):
    """Sent the host's ids, a verifier that scores another split (one entry
    fewer) did not score what was drawn: refused, against it only."""
    verified, verifier = await verified_and_verifier()
    ids = await database_sync_to_async(_ids)(*HELLO)
    await _answered(
        api_key, verified, pieces=["".join(HELLO)], ids=ids, temperature=1.0
    )
    _, verify = await verify_to([verifier])
    assert verify["token_ids"] == ids
    await verifier.send(verifier.scores_frame(verify, scores_of(verify, PLAUSIBLE)[1:]))
    ver = await verification_until(verify["job"])
    assert ver.status == "refused"
    assert ver.detail == f"{len(ids) - 1} scores for an answer of {len(ids)} tokens"
    await verified.close()
    await verifier.close()


@pytest.mark.asyncio
async def test_an_answer_under_a_schema_is_verified_under_it_with_its_ids(
    verifying, api_key
):
    """A ``json_schema`` answer with the host's ids goes to a verifier whose
    engine declares ``json_schema`` (never to one that cannot apply the
    grammar, however well ranked), with the ids and the ``response_format``
    to score them under; without ids, as its text under the grammar."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    verified = await host_online(
        "a@example.com", "a", verifies=False, score=95, features=("json_schema",)
    )
    plain = await host_online("b@example.com", "b", verifies=True, score=90)
    able = await host_online(
        "c@example.com", "c", verifies=True, score=60, features=("json_schema",)
    )
    # (a JSON answer, as the grammar allows: one that is not is ruled out,
    # jobs.formats.answer_ruled_out; drawn a character at a time)
    ids = await database_sync_to_async(_ids)(*JSON_ANSWER)
    await _answered(
        api_key, verified, pieces=["".join(JSON_ANSWER)], ids=ids, response_format=fmt
    )
    host, verify = await verify_to([plain, able])
    assert host is able
    assert verify["token_ids"] == ids
    assert verify["response_format"]["json_schema"]["schema"] == schema
    await able.send(able.scores_frame(verify, scores_of(verify, PLAUSIBLE)))
    assert (await verification_until(verify["job"])).verdict == "plausible"

    # without ids (fresh-eyes review 3: a cheat leaving them out was never
    # verified): its text, tokenized again, scored under the same grammar
    request = chat_request(api_key, stream=False, response_format=fmt)
    offer = await verified.recv_type("offer")
    await verified.answer(offer, ["".join(JSON_ANSWER)])  # no token_ids
    assert (await request).status_code == 200
    host, verify = await verify_to([plain, able])
    assert host is able and "token_ids" not in verify
    assert verify["response_format"]["json_schema"]["schema"] == schema
    assert verify["answer"] == "".join(JSON_ANSWER)
    for host in (verified, plain, able):
        await host.close()


@pytest.mark.asyncio
async def test_more_ids_than_max_tokens_are_an_inflated_count_never_sent(
    verifying, api_key
):
    """Ids that spell the text but outnumber the request's ``max_tokens`` (a
    host re-splitting its answer finer to inflate its count): flagged as the
    host's, and never sent to a verifier, who scores at most ``max_tokens``
    of them and would be blamed for the rest."""
    verified, verifier = await verified_and_verifier()
    text = "".join(HELLO)  # 8 tokens, within max_tokens: delivered whole
    per_character = await database_sync_to_async(_ids)(*text)
    attempt = await _answered(
        api_key,
        verified,
        pieces=[text],
        ids=per_character,
        temperature=1.0,
        max_tokens=len(HELLO),
    )
    assert attempt.output_text == text
    assert attempt.token_count_flagged and attempt.verify_token_ids is None
    _, verify = await verify_to([verifier])
    assert "token_ids" not in verify
    await verified.close()
    await verifier.close()
