"""``catalog_add PATH``: a catalog entry read from the model's GGUF file
(DESIGN.md "Models (the catalog)"): what it pins (digest, quantization), its
family, context, special tokens, tool-call format, VRAM estimates, and the
vocabulary and template the coordinator keeps; prices the operator's. On the
real SmolLM2 file (as the migration pinned it) and on a model of another family
written from one of llama.cpp's vocabulary files."""

from __future__ import annotations

import hashlib
import importlib
from io import StringIO
from pathlib import Path

import gguf
import numpy as np
import pytest
from django.core.management import CommandError, call_command

from catalog.models import CatalogModel, ModelData
from modeldata.entry import tool_call_format
from modeldata.modelfile import VocabData
from modeldata.reference import smollm2_gguf_path
from tests.modeldata.vectors import VectorsUnavailable, vectors_fetch

pytestmark = pytest.mark.django_db

PINNED = importlib.import_module("catalog.migrations.0003_weights").REFERENCE

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}"
    '{{ tool | tojson }}{% endfor %}</tools>\nReturn <tool_call>{"name": ...,'
    ' "arguments": ...}</tool_call><|im_end|>\n{%- endif %}'
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def vectors() -> Path:
    try:
        return vectors_fetch()
    except VectorsUnavailable as exc:
        pytest.skip(f"llama.cpp's vocabulary files cannot be downloaded: {exc}")


def add(*args: str) -> str:
    out = StringIO()
    call_command("catalog_add", *args, stdout=out)
    return out.getvalue()


def model_from_vocab(vocab_file: Path, path: Path, *, template: str) -> Path:
    """A GGUF model at ``path``: ``vocab_file``'s metadata (architecture,
    shape, tokenizer), chat ``template``, and one small F16 tensor of weights
    fixed by a seed (catalog_add reads metadata; nothing runs it here)."""
    reader = gguf.GGUFReader(vocab_file)
    architecture = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(path, architecture)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "tokenizer.chat_template":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    writer.add_chat_template(template)
    weights = np.random.default_rng(7).standard_normal((64, 32)).astype(np.float16)
    writer.add_tensor("token_embd.weight", weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_it_reads_smollm2s_file_as_the_catalog_pins_it():
    """The real SmolLM2 file gives what the migration pinned for the
    reference entry (digest, quantization, special tokens, VRAM), the vocabulary
    and template hosts render with; the price is the operator's."""
    path = smollm2_gguf_path()
    printed = add(
        str(path), "--id", "smollm2-again", "--price-out", "0.2",
        "--context-length", "2048",
    )  # fmt: skip
    entry = CatalogModel.objects.get(id="smollm2-again")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert entry.weights_sha256 == digest == PINNED["weights_sha256"]
    assert entry.quantization == PINNED["quantization"] == "Q4_1"
    assert entry.family == "smollm2"
    assert entry.context_length == 2048
    assert entry.special_tokens == PINNED["special_tokens"]
    assert entry.special_tokens["eos"] == {"id": 2, "text": "<|im_end|>"}
    assert entry.tool_call_format == PINNED["tool_call_format"] == ""
    assert entry.vram_weights_mb == PINNED["vram_weights_mb"]
    assert entry.vram_per_request_mb == PINNED["vram_per_request_mb"]
    assert (entry.price_prompt_nano, entry.price_completion_nano) == (0, 200)
    vocab = VocabData.from_json(ModelData.objects.get(model=entry).vocab_json)
    assert len(vocab.tokens) == 49152
    assert vocab.chat_template.startswith("{% for message in messages %}")
    assert f"weights sha256 {digest}" in printed
    assert "price per million tokens: in 0 USD, out 0.2 USD" in printed
    reference = CatalogModel.objects.get(id="smollm2-135m-instruct")
    assert reference.weights_sha256 == digest, "the migration pinned the same file"


def test_it_reads_another_family_from_its_file(vectors, tmp_path):
    """A Phi-3 model (llama.cpp's Phi-3 vocabulary file and shape, a template
    with tools): its own family, quantization, context, special tokens,
    tool-call format, and the KV cache its shape needs per token."""
    path = model_from_vocab(
        vectors / "ggml-vocab-phi-3.gguf",
        tmp_path / "phi3-tiny.gguf",
        template=TOOLS_TEMPLATE,
    )
    add(str(path), "--id", "phi3-tiny", "--price-in", "0.05", "--price-out", "1.125")
    entry = CatalogModel.objects.get(id="phi3-tiny")
    assert entry.weights_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert entry.quantization == "F16"
    assert entry.family == "Phi3"
    assert entry.context_length == 4096
    assert entry.special_tokens == {
        "bos": {"id": 1, "text": "<s>"},
        "eos": {"id": 32000, "text": "<|endoftext|>"},
        "unk": {"id": 0, "text": "<unk>"},
        "pad": {"id": 32000, "text": "<|endoftext|>"},
    }
    assert entry.tool_call_format == "hermes"
    # 32 layers × 32 KV heads × 96 (3072 / 32) × (key + value) × 2 bytes (F16)
    kv_per_token = 32 * 32 * 96 * 2 * 2
    logits = 512 * 32064 * 4  # OUTPUT_BATCH_TOKENS × vocabulary × float32
    assert entry.vram_per_request_mb == -(-(kv_per_token * 4096 + logits) // 2**20)
    assert entry.vram_weights_mb == 1  # 64 × 32 F16 weights, rounded up
    assert (entry.price_prompt_nano, entry.price_completion_nano) == (50, 1125)
    vocab = VocabData.from_json(ModelData.objects.get(model=entry).vocab_json)
    assert (vocab.model, vocab.chat_template) == ("llama", TOOLS_TEMPLATE)
    with pytest.raises(CommandError) as refused:
        add(
            str(path),
            "--id",
            "phi3-long",
            "--price-out",
            "1",
            "--context-length",
            "4097",
        )
    assert str(refused.value) == "context length 4097: from 1 to the file's 4096"


def test_it_refuses_a_vocabulary_only_file(vectors):
    file = vectors / "ggml-vocab-phi-3.gguf"
    with pytest.raises(CommandError) as refused:
        add(str(file), "--id", "phi3-vocab", "--price-out", "1")
    assert str(refused.value) == (
        f"{file} holds no weights (a vocabulary-only file): hosts could not run it"
    )
    assert not CatalogModel.objects.filter(id="phi3-vocab").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--id", "Bad Id", "--price-out", "1"], "model id 'Bad Id': lowercase"),
        (["--id", "smollm2-135m-instruct", "--price-out", "1"], "is in the catalog"),
        (["--id", "new-one"], "a new entry needs its prices"),
        (["--id", "new-one", "--price-out", "0.0001"], "--price-out must be a"),
        (["--id", "new-one", "--price-out", "-1"], "--price-out must be a"),
    ],
    ids=["bad id", "taken id", "no price", "price too fine", "negative"],
)
def test_it_refuses_what_is_wrong_naming_it(args, message):
    """Refused before the file is read (a few GB take minutes to hash)."""
    before = list(CatalogModel.objects.values_list("id", "weights_sha256"))
    with pytest.raises(CommandError) as refused:
        add(str(smollm2_gguf_path()), *args)
    assert message in str(refused.value)
    assert list(CatalogModel.objects.values_list("id", "weights_sha256")) == before


def test_it_refuses_a_file_that_is_not_gguf(tmp_path):
    text = tmp_path / "model.gguf"
    text.write_text("not a model")
    with pytest.raises(CommandError) as refused:
        add(str(text), "--id", "x", "--price-out", "1")
    assert "not a GGUF file" in str(refused.value)
    with pytest.raises(CommandError) as refused:
        add(str(tmp_path / "missing.gguf"), "--id", "x", "--price-out", "1")
    assert "No such file" in str(refused.value)


def test_a_replaced_entry_keeps_its_prices_and_takes_the_new_pin(vectors, tmp_path):
    first = model_from_vocab(
        vectors / "ggml-vocab-phi-3.gguf", tmp_path / "a.gguf", template="{{ x }}"
    )
    add(str(first), "--id", "phi3-tiny", "--price-out", "3")
    second = model_from_vocab(
        vectors / "ggml-vocab-phi-3.gguf",
        tmp_path / "b.gguf",
        template=TOOLS_TEMPLATE,
    )
    add(str(second), "--id", "phi3-tiny", "--replace")
    entry = CatalogModel.objects.get(id="phi3-tiny")
    assert entry.weights_sha256 == hashlib.sha256(second.read_bytes()).hexdigest()
    assert (entry.price_prompt_nano, entry.price_completion_nano) == (0, 3000)
    assert entry.tool_call_format == "hermes"


def test_staff_add_an_entry_from_a_file_in_the_admin(admin_client, vectors, tmp_path):
    path = model_from_vocab(
        vectors / "ggml-vocab-phi-3.gguf", tmp_path / "m.gguf", template="{{ x }}"
    )
    form = admin_client.get("/admin/catalog/catalogmodel/add/")
    assert "Add a model from its GGUF file" in form.content.decode()
    refused = admin_client.post(
        "/admin/catalog/catalogmodel/add/",
        {"path": str(tmp_path / "none.gguf"), "price_in": "0", "price_out": "1"},
    )
    assert "cannot read it" in refused.content.decode()
    added = admin_client.post(
        "/admin/catalog/catalogmodel/add/",
        {
            "path": str(path),
            "model_id": "phi3-admin",
            "price_in": "0",
            "price_out": "2",
        },
    )
    assert added.status_code == 302
    entry = CatalogModel.objects.get(id="phi3-admin")
    assert entry.weights_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert entry.price_completion_nano == 2000


@pytest.mark.parametrize(
    ("template", "format_"),
    [
        ("{{ messages }}", ""),
        (
            "{% if tools %}[AVAILABLE_TOOLS]{{ tools }}{% endif %}[TOOL_CALLS]",
            "mistral",
        ),
        (
            "{% if tools %}{{ '<|start_header_id|>ipython' }}{\"name\": name,"
            ' "parameters": args}{% endif %}',
            "llama3",
        ),
        ("{% if tools %}<|python_tag|>{% endif %}", "llama3"),
        ("{% for tool in tools %}{{ tool.name }}{% endfor %}", "other"),
    ],
    ids=["none", "mistral", "llama3 json", "llama3 tag", "other"],
)
def test_it_names_the_tool_call_format_of_a_template(template, format_):
    assert tool_call_format(template) == format_
