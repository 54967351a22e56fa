"""The request step's context check (``jobs.services.job_open``): the prompt plus
``max_tokens`` must fit the model's context. Cheap bounds on the prompt's bytes
and framing decide without tokenizing (megabytes are refused at once); near the
context the tokenizer decides, counting the template's default system prompt."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobs.errors import ApiError
from jobs.models import Job
from jobs.requests import ROLES, completion_request_parse
from jobs.services import job_open
from jobs.tokens import prompt_token_count, prompt_tokens_most
from tests.jobs.helpers import key_of, open_job, request_parsed

pytestmark = pytest.mark.django_db(transaction=True)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(sorted(ROLES)), st.text(max_size=120)),
        min_size=1,
        max_size=12,
    ),
    st.text(max_size=300),
)
@example(messages=[("assistant", "")], prompt="\x06")  # no token: dropped
@example(messages=[("user", "x\x13\x14y")], prompt="\x16\x1d\x04")
def test_the_context_checks_cheap_bounds_hold_the_count(messages, prompt):
    """``_request_fits`` admits a prompt on ``prompt_tokens_most`` (bytes) and
    refuses one on ``prompt_tokens_least`` (its messages' framing) without
    rendering or tokenizing it: for the reference model's template and tokenizer,
    chat and raw prompts alike, whatever the roles and contents (empty, one
    character, text that may merge with the framing), least <= count <= most."""
    from jobs.tokens import prompt_tokens_least
    from tests.conftest import REFERENCE_MODEL

    model = REFERENCE_MODEL["id"]
    chat = [{"role": role, "content": text} for role, text in messages]
    for chat_or_none, raw in ((chat, None), (None, prompt)):
        count = prompt_token_count(model, chat_or_none, raw)
        assert prompt_tokens_least(model, chat_or_none, raw) <= count
        assert count <= prompt_tokens_most(model, chat_or_none, raw)


def _refused_untokenized(monkeypatch, key, parsed) -> ApiError:
    """The 400 ``context_length_exceeded`` of ``job_open`` for ``parsed``,
    asserting that the prompt was never tokenized."""
    from jobs.services import requests as step

    def never(*args, **kwargs):
        raise AssertionError("tokenized")

    monkeypatch.setattr(step, "prompt_token_count", never)
    with pytest.raises(ApiError) as refused:
        job_open(api_key=key, request=parsed, waiting_channel="w.1")
    assert refused.value.status == 400
    assert refused.value.code == "context_length_exceeded"
    return refused.value


def test_a_request_of_too_many_messages_is_refused_without_tokenizing(
    renter, live_device, monkeypatch
):
    """20,000 one-character messages can never fit 2,048 tokens: refused 400 at
    once (rendering and tokenizing them took ~45 s of the process's time)."""
    live_device()
    key = key_of(renter)
    parsed = request_parsed()
    parsed.messages = [{"role": "user", "content": "x"}] * 20_000
    refused = _refused_untokenized(monkeypatch, key, parsed)
    assert "20000 messages" in refused.message
    assert not Job.objects.exists()


@pytest.mark.parametrize("shape", ["one message", "raw prompt"])
def test_megabytes_of_prompt_are_refused_without_tokenizing(
    renter, live_device, monkeypatch, shape
):
    """A prompt of 4 MB can never fit 2,048 tokens (no token stands for more
    than ``_token_bytes_most`` bytes): refused 400 at once, not tokenized for
    seconds under the tokenizer's one lock (found by a fresh-eyes check)."""
    live_device()
    key = key_of(renter)
    text = "lorem ipsum " * 350_000
    if shape == "one message":
        parsed = request_parsed(content=text)
    else:
        from tests.conftest import REFERENCE_MODEL

        parsed = completion_request_parse(
            {"model": REFERENCE_MODEL["id"], "prompt": text, "max_tokens": 8},
            endpoint=Job.Endpoint.COMPLETION,
        )
    refused = _refused_untokenized(monkeypatch, key, parsed)
    assert refused.param == ("messages" if shape == "one message" else "prompt")
    assert ("1 message)" if shape == "one message" else "characters)") in (
        refused.message
    )
    assert not Job.objects.exists()


def test_no_token_stands_for_more_bytes_than_the_bound():
    """The byte bound's premise, on the reference vocabulary: the longest
    token's text (special tokens included), repeated, counts at least its
    bytes over the bound in tokens; and special tokens' text in a prompt is
    counted as the engine counts it."""
    from llama_cpp import Llama

    from agent.engines.smollm2 import smollm2_gguf_path
    from agent.engines.vocab import vocab_pieces
    from catalog.modeldata import model_tokenizer
    from jobs.tokens import _token_bytes_most, prompt_tokens_least
    from tests.conftest import REFERENCE_MODEL

    model = REFERENCE_MODEL["id"]
    most = _token_bytes_most(model_tokenizer(model))
    llama = Llama(model_path=str(smollm2_gguf_path()), vocab_only=True, verbose=False)
    try:  # llama.cpp's own pieces, not the coordinator's
        pieces = vocab_pieces(llama, special=True)
    finally:
        llama.close()
    longest = max(pieces, key=len).decode("utf-8", "replace")
    assert len(longest.encode("utf-8")) == most > 32  # 64 dashes
    for text in (
        longest * 50,
        "<|im_start|>" * 200,
        " " * 5000,
        "-" * 6400,
        "\x06" * 3000,  # a character no token stands for: dropped
        "a\x04b\x1d" * 500,
    ):
        count = prompt_token_count(model, None, text)
        assert prompt_tokens_least(model, None, text) <= count
        chat = [{"role": "user", "content": text}]
        assert prompt_tokens_least(model, chat, None) <= prompt_token_count(
            model, chat, None
        )


def test_the_context_check_counts_the_templates_default_system_prompt(
    renter, live_device
):
    """2,030 one-token words render to 2,060 tokens with SmolLM2's template (its
    default system prompt): with max_tokens 9 that is over 2,048, refused here
    rather than failing on the host (which would count against its score)."""
    live_device()
    key = key_of(renter)
    with pytest.raises(ApiError) as refused:
        open_job(key, content=" hello" * 2030, max_tokens=9)
    assert refused.value.status == 400 and "2060 tokens" in refused.value.message
    _, _, dispatch = open_job(key, content=" hello" * 2000)  # 2,030 + 16 fit
    assert dispatch.attempt is not None


def test_a_prompt_near_the_context_is_counted_exactly(renter, live_device, catalog):
    """Over the byte bound the tokenizer decides: 2,000 one-token words and
    max_tokens 16 fit 2,048; 40 more tokens do not."""
    live_device()
    key = key_of(renter)
    words = " the" * 2000  # 8,000 bytes, 2,000 tokens
    _, _, dispatch = open_job(key, content=words)
    assert dispatch.attempt is not None
    with pytest.raises(ApiError) as refused:
        open_job(key, content=words + " the" * 40)
    assert refused.value.status == 400
