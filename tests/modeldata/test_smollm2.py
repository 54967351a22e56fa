"""The model the project ships (SmolLM2-135M-Instruct, Q4_1): its file read, its
vocabulary kept as JSON and back, tokenized as llama.cpp does, its chat template
rendered as the agent rendered it before the template moved to modeldata."""

from __future__ import annotations

import hashlib

import llama_cpp
import pytest

from agent.engines.vocab import vocab_pieces
from modeldata.modelfile import ModelFileError, VocabData, model_file_read
from modeldata.template import ChatTemplate, ChatTemplateError, prompt_build
from modeldata.vocab import Vocabulary
from tests.modeldata.conftest import vocabulary
from tests.modeldata.samples import texts

SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n"
)
RENDERED = [
    # (messages, prompt, continue_from, what agent/engines/chat_template.py
    # rendered before it moved, printed by it from this same file)
    (
        [{"role": "user", "content": "What is 2+2?"}],
        None,
        "",
        SYSTEM + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Où est la gare ? 🚉"},
        ],
        None,
        "",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nOù est la gare ? 🚉<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Hi "},
                    {"type": "text", "text": "there"},
                ],
            }
        ],
        None,
        "Sure",
        SYSTEM + "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nSure",
    ),
    (None, "The sky is", " bl", "The sky is bl"),
]


@pytest.fixture(scope="module")
def model(smollm2_path):
    return model_file_read(smollm2_path)


@pytest.fixture(scope="module")
def llama(smollm2_path):
    llama = llama_cpp.Llama(
        model_path=str(smollm2_path), vocab_only=True, verbose=False
    )
    yield llama
    llama.close()


def test_it_reads_what_the_file_is(model, smollm2_path, llama) -> None:
    assert model.sha256 == hashlib.sha256(smollm2_path.read_bytes()).hexdigest()
    assert model.size_bytes == smollm2_path.stat().st_size
    assert (model.architecture, model.family, model.quantization) == (
        "llama",
        "smollm2",
        "Q4_1",
    )
    assert model.context_length == int(llama.metadata["llama.context_length"])
    assert model.parameters == 134_515_008  # 135M, as the file's size label says
    assert 90_000_000 < model.weights_bytes < model.size_bytes
    vocab = model.vocab
    assert (vocab.model, vocab.pre) == ("gpt2", "smollm")
    assert len(vocab.tokens) == len(vocab.token_types) == llama.n_vocab()
    assert len(vocab.merges) == 48_900 and vocab.scores == ()
    assert (vocab.bos_id, vocab.eos_id) == (llama.token_bos(), llama.token_eos())
    assert vocab.add_bos is False
    assert vocab.chat_template == llama.metadata["tokenizer.chat_template"]


def test_its_vocabulary_survives_json(model, smollm2_path) -> None:
    """The vocabulary and template the coordinator keeps: compact (under 2 MB),
    read back equal, and tokenizing the same."""
    text = model.vocab.to_json()
    assert len(text.encode("utf-8")) < 2_000_000
    again = VocabData.from_json(text)
    assert again == model.vocab
    sample = "Hello <|im_start|>wörld 🦙\n\n  x"
    assert Vocabulary(again).tokenize(sample, add_bos=True, special=True) == vocabulary(
        smollm2_path
    ).tokenize(sample, add_bos=True, special=True)
    with pytest.raises(ModelFileError):
        VocabData.from_json('{"format": 99}')


def test_it_tokenizes_as_llama_cpp_does(smollm2_path, llama) -> None:
    """300 varied texts with and without BOS and special tokens."""
    tokens = vocabulary(smollm2_path)
    for special in (False, True):
        for add_bos in (False, True):
            for text in texts():
                want = llama.tokenize(
                    text.encode("utf-8"), add_bos=add_bos, special=special
                )
                assert (
                    tokens.tokenize(text, add_bos=add_bos, special=special) == want
                ), text


def test_special_tokens_become_their_ids_only_when_asked(smollm2_path) -> None:
    tokens = vocabulary(smollm2_path)
    text = "<|im_start|>user\nHi<|im_end|>"
    assert tokens.tokenize(text, add_bos=False, special=True)[0] == 1
    assert 1 not in tokens.tokenize(text, add_bos=False, special=False)


def test_ids_map_back_to_their_bytes(smollm2_path, llama) -> None:
    """Every id's bytes as the agent reads them from llama.cpp; detokenize
    gives back the text (special tokens' text only when asked)."""
    tokens = vocabulary(smollm2_path)
    assert [tokens.token_bytes(t) for t in range(len(tokens))] == vocab_pieces(
        llama, special=True
    )
    assert [
        tokens.token_bytes(t, special=False) for t in range(len(tokens))
    ] == vocab_pieces(llama, special=False)
    for text in texts():
        ids = tokens.tokenize(text, add_bos=False, special=True)
        assert tokens.detokenize(ids, special=True) == text.encode("utf-8")
    ids = tokens.tokenize("<|im_end|>ok", add_bos=False, special=True)
    assert tokens.detokenize(ids) == b"ok"


@pytest.mark.parametrize(("messages", "prompt", "continue_from", "expected"), RENDERED)
def test_the_template_renders_as_the_agent_did(
    model, messages, prompt, continue_from, expected
) -> None:
    template = ChatTemplate.from_vocab(model.vocab)
    assert prompt_build(template, messages, prompt, continue_from) == expected


def test_template_helpers_are_there() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{% if messages|length > 2 %}{{ raise_exception('too many') }}"
        "{% endif %}{{ strftime_now('%Y') | length }}{{ eos_token }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert template.render([{"role": "user", "content": "x"}]) == "<s>4</s>"
    with pytest.raises(ChatTemplateError, match="too many"):
        template.render([{"role": "user", "content": "x"}] * 3)
