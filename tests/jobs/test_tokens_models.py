"""Every per-model rule from the catalog's data (issue 31 item 3): a second
model, with Llama 3's vocabulary (llama.cpp's own ``ggml-vocab-llama-bpe.gguf``)
and Llama 3's chat template, added to the catalog as data, is counted by its own
tokenizer: the recount and ``min(reported, recount)`` billing, the check of a
host's token ids, the renter's ``max_tokens`` cut, a continuation's budget,
prompt token counts and the context refusal, each equal to llama.cpp's own
numbers (its test vectors, llama-cpp-python on the same file) and unlike
SmolLM2's. Nothing here names a model in code: the rules read the catalog.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from pathlib import Path

import llama_cpp
import pytest

from ballast.db import db_call
from catalog.modeldata import model_data_save, model_tokenizer, model_tokenizer_load
from catalog.models import CatalogModel, ModelData
from jobs.errors import ApiError
from jobs.models import Attempt, Job
from jobs.orchestration.budget import OutputBudget
from jobs.requests import completion_request_parse
from jobs.services.segments import segment_tokens
from jobs.services.dispatch import offer_frame
from jobs.services.requests import request_fits
from jobs.tokens import (
    prompt_token_count,
    prompt_tokens_least,
    prompt_tokens_most,
    token_count,
    token_ids_spell,
)
from modeldata.modelfile import VocabData, vocab_data_read
from modeldata.template import ChatTemplate, prompt_build
from modeldata.vocab import UnsupportedVocabulary
from tests.conftest import REFERENCE_MODEL, reference_vocab_json
from tests.modeldata.vectors import VectorsUnavailable, vectors_fetch, vectors_read

pytestmark = pytest.mark.django_db

SECOND = "llama-3-vocab-test"
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
"""Meta-Llama-3-Instruct's chat template (its GGUF's ``tokenizer.chat_template``):
the vocabulary file of llama.cpp's tests has none."""


@functools.cache
def _vectors() -> Path:
    return vectors_fetch()


def _vocab_path(name: str) -> Path:
    try:
        folder = _vectors()
    except VectorsUnavailable as exc:
        pytest.skip(f"llama.cpp's tokenizer vectors cannot be downloaded: {exc}")
    return folder / f"ggml-vocab-{name}.gguf"


@functools.cache
def _llama3_data() -> VocabData:
    data = vocab_data_read(_vocab_path("llama-bpe"))
    return dataclasses.replace(data, chat_template=LLAMA3_TEMPLATE)


@pytest.fixture
def second():
    """The second model's catalog entry, its data stored by ``model_data_save``
    (as ``catalog_add`` stores a file's)."""
    entry, _ = CatalogModel.objects.update_or_create(
        id=SECOND,
        defaults={
            "family": "llama3",
            "context_length": 96,
            "vram_per_request_mb": 256,
            "price_completion_nano": 300,
        },
    )
    model_data_save(entry, _llama3_data())
    return entry


@pytest.fixture(scope="module")
def llama3_cpp():
    """llama-cpp-python on the same vocabulary file: the independent reference."""
    llama = llama_cpp.Llama(
        model_path=str(_vocab_path("llama-bpe")), vocab_only=True, verbose=False
    )
    yield llama
    llama.close()


def test_the_recount_and_the_bill_are_the_models_own(second, llama3_cpp):
    """On llama.cpp's test vectors of Llama 3's vocabulary: the recount is the
    vector's count, the ids llama.cpp gives spell the text, a host's count above
    it is billed at the recount (and flagged when far above); SmolLM2's
    tokenizer counts many of these texts otherwise."""
    cases = [(t, ids) for t, ids in vectors_read(_vocab_path("llama-bpe")) if ids]
    assert len(cases) > 30
    differ = 0
    for text, ids in cases:
        assert token_count(SECOND, text) == len(ids), text
        if "\x00" not in text:
            assert token_ids_spell(SECOND, ids=ids, text=text), text
        billed, inflated = segment_tokens(
            model_id=SECOND, text=text, reported=len(ids) + 1
        )
        assert billed == min(len(ids), len(text))
        assert inflated == (len(ids) + 1 > len(text)), text
        differ += token_count(REFERENCE_MODEL["id"], text) != len(ids)
    assert differ >= len(cases) // 4  # 18 of 45: short texts split alike
    text = "The quick brown fox jumps over the lazy dog. " * 8
    ids = llama3_cpp.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    recount = token_count(SECOND, text)
    assert recount == len(ids)
    assert segment_tokens(model_id=SECOND, text=text, reported=recount * 2) == (
        recount,
        True,
    )
    # a host's own ids are its count when they spell the text in this model's
    # vocabulary; SmolLM2's ids of the same text do not
    assert token_ids_spell(SECOND, ids=ids, text=text)
    smollm2 = model_tokenizer(REFERENCE_MODEL["id"])
    smollm2_ids = smollm2.vocab.tokenize(text, add_bos=False, special=False)
    assert not token_ids_spell(SECOND, ids=smollm2_ids, text=text)


def test_prompt_counts_and_the_context_refusal_follow_the_models_template(
    second, llama3_cpp
):
    """A chat is rendered with the entry's own template (its BOS printed by the
    template, added once) and counted as llama.cpp counts it; the request step
    refuses it past the entry's context (96 tokens), not SmolLM2's."""
    messages = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "What colour is the sky on a clear day?"},
    ]
    template = ChatTemplate.from_vocab(_llama3_data())
    rendered = prompt_build(template, messages, None, "")
    assert rendered.startswith("<|begin_of_text|><|start_header_id|>system")
    want = llama3_cpp.tokenize(rendered.encode("utf-8"), add_bos=False, special=True)
    count = prompt_token_count(SECOND, messages, None)
    assert count == len(want)
    assert prompt_tokens_least(SECOND, messages, None) <= count
    assert count <= prompt_tokens_most(SECOND, messages, None)
    assert count != prompt_token_count(REFERENCE_MODEL["id"], messages, None)
    raw = "Once upon a time"
    assert prompt_token_count(SECOND, None, raw) == len(
        llama3_cpp.tokenize(raw.encode("utf-8"), add_bos=True, special=True)
    )

    def request(max_tokens: int):
        return completion_request_parse(
            {"model": SECOND, "messages": messages, "max_tokens": max_tokens},
            endpoint="chat",
        )

    request_fits(second, request(96 - count))  # fits exactly
    with pytest.raises(ApiError) as refused:
        request_fits(second, request(96 - count + 1))
    assert refused.value.code == "context_length_exceeded"
    assert f"({count} tokens)" in refused.value.message
    assert "context of 96 tokens" in refused.value.message


def test_the_output_and_continuation_budgets_count_the_models_tokens(second):
    """The renter's ``max_tokens`` cuts the relayed text at that many of the
    model's tokens, and a continuation is offered what is left after the text
    received, counted by the model's tokenizer."""
    # numbers: Llama 3 groups digits by three, SmolLM2 splits every digit
    text = "Invoice 1234567890 totals 98765 units, façade naïve déjà vu. " * 4
    total = token_count(SECOND, text)
    budget = OutputBudget(model_id=SECOND, max_tokens=total // 2)
    delivered, over = budget.take(text)
    assert over and token_count(SECOND, delivered) == total // 2
    assert token_count(SECOND, text[: len(delivered) + 2]) > total // 2
    job = Job(
        model_id=SECOND,
        endpoint=Job.Endpoint.CHAT,
        messages=[{"role": "user", "content": "Go on."}],
        params={"max_tokens": 200},
    )
    attempt = Attempt(id=uuid.uuid4())
    frame = offer_frame(job=job, attempt=attempt, device_index=0, continue_from=text)
    assert frame["params"]["max_tokens"] == 200 - total
    assert total != token_count(REFERENCE_MODEL["id"], text)


def test_a_model_without_data_falls_back_and_one_that_cannot_run_is_refused():
    """A catalog entry without data has no tokenizer (the host's word, capped by
    characters); one whose vocabulary the coordinator cannot run (a BERT
    vocabulary) is refused when stored, not counted by the host's word."""
    entry = CatalogModel.objects.create(
        id="no-data-model",
        family="x",
        context_length=4096,
        vram_per_request_mb=256,
        price_completion_nano=1,
    )
    assert model_tokenizer(entry.id) is None
    assert token_count(entry.id, "some text") is None
    assert segment_tokens(model_id=entry.id, text="some text", reported=50) == (
        9,
        True,
    )
    with pytest.raises(UnsupportedVocabulary):
        model_data_save(entry, vocab_data_read(_vocab_path("bert-bge")))
    assert not ModelData.objects.filter(model=entry).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_in_an_event_loop_a_tokenizer_is_read_only_off_it():
    """Django forbids a query in an event loop's thread: there a model's
    tokenizer is only what the process built, and ``JobRun.events`` loads it in
    a worker thread first (``db_call(model_tokenizer_load)``)."""
    model_id = "async-loaded-model"

    def add() -> None:
        entry = CatalogModel.objects.create(
            id=model_id,
            family="smollm2",
            context_length=2048,
            vram_per_request_mb=256,
            price_completion_nano=1,
        )
        ModelData.objects.create(model=entry, vocab_json=reference_vocab_json())

    await db_call(add)()
    text = "Loaded off the loop, counted on it."
    assert token_count(model_id, text) is None  # no query from the loop
    assert await db_call(model_tokenizer_load)(model_id) is not None
    assert token_count(model_id, text) == token_count(REFERENCE_MODEL["id"], text)
