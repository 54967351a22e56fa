"""The tokenizer agrees with llama.cpp on llama.cpp's own test vectors, for every
vocabulary file llama-cpp-python's source ships, and with llama-cpp-python
itself (the same llama.cpp) on varied texts, ids to bytes included.

Every ``ggml-vocab-*.gguf`` is named here: as supported (every case matches),
or as a tokenizer type this package does not run (``UNSUPPORTED``, it refuses
to build one). A file a new llama.cpp adds fails ``test_every_file_is_named``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import pytest

from modeldata.modelfile import vocab_data_read
from modeldata.vocab import UnsupportedVocabulary, Vocabulary
from tests.modeldata.conftest import vocabulary
from tests.modeldata.samples import texts
from tests.modeldata.vectors import vectors_read

SUPPORTED = {
    # name: (tokenizer.ggml.model, tokenizer.ggml.pre); no vectors: llama.cpp's
    # own tokenize is the reference
    "aquila": "gpt2 BPE, no pre-tokenizer name (llama.cpp's default)",
    "baichuan": "llama SPM",
    "command-r": "gpt2 BPE, command-r",
    "deepseek-coder": "gpt2 BPE, deepseek-coder",
    "deepseek-llm": "gpt2 BPE, deepseek-llm",
    "falcon": "gpt2 BPE, falcon",
    "gemma-4": "gemma4 BPE over ▁-escaped UTF-8",
    "gpt-2": "gpt2 BPE, gpt-2",
    "gpt-neox": "gpt2 BPE, no pre-tokenizer name (llama.cpp's default)",
    "llama-bpe": "gpt2 BPE, llama-bpe (Llama 3)",
    "llama-spm": "llama SPM (Llama 2, Mistral)",
    "mpt": "gpt2 BPE, mpt",
    "phi-3": "llama SPM, Phi-3's special tokens eat the spaces after them",
    "qwen2": "gpt2 BPE, qwen2",
    "qwen35": "gpt2 BPE, qwen35",
    "refact": "gpt2 BPE, refact",
    "starcoder": "gpt2 BPE, starcoder",
}
UNSUPPORTED = {
    "bert-bge": "bert: WordPiece, embedding models only",
    "nomic-bert-moe": "t5: Unigram with a precompiled normalizer, embedding models only",
}


def name_of(path: Path) -> str:
    return path.name.removeprefix("ggml-vocab-").removesuffix(".gguf")


def vocab_path(vectors: Path, name: str) -> Path:
    path = vectors / f"ggml-vocab-{name}.gguf"
    assert path.exists(), f"{path.name} is in llama-cpp-python's source"
    return path


def test_every_file_is_named(vectors) -> None:
    present = {name_of(p) for p in vectors.glob("ggml-vocab-*.gguf")}
    assert present == SUPPORTED.keys() | UNSUPPORTED.keys()


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_it_refuses_the_types_it_does_not_run(vectors, name) -> None:
    with pytest.raises(UnsupportedVocabulary):
        Vocabulary(vocab_data_read(vocab_path(vectors, name)))


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_it_matches_llama_cpps_test_vectors(vectors, name) -> None:
    """As llama.cpp's ``test-tokenizer-0``: no BOS, special tokens not parsed."""
    path = vocab_path(vectors, name)
    cases = vectors_read(path)
    if not cases:
        pytest.skip(f"{path.name} has no .inp/.out (llama-cpp-python compares it)")
    tokens = vocabulary(path)
    wrong = [
        (text, got, want)
        for text, want in cases
        if (got := tokens.tokenize(text, add_bos=False, special=False)) != want
    ]
    assert wrong == [], f"{len(wrong)} of {len(cases)} cases differ"


def llama_pieces(llama: llama_cpp.Llama, *, special: bool) -> list[bytes]:
    """``llama_token_to_piece`` of every id."""
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    buffer = ctypes.create_string_buffer(1024)
    pieces = []
    for token in range(llama.n_vocab()):
        size = llama_cpp.llama_token_to_piece(vocab, token, buffer, 1024, 0, special)
        assert size >= 0
        pieces.append(buffer.raw[:size])
    return pieces


def agreement(path: Path, samples: list[str]) -> list[tuple]:
    """Where this package and llama-cpp-python differ on ``path``'s vocabulary:
    its BOS, EOS and end-of-generation tokens, tokenizing each sample with and
    without BOS and special tokens, and the bytes of every id with and without
    special tokens."""
    tokens = vocabulary(path)
    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        eog = {
            t for t in range(llama.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)
        }
        differ = [
            (what, ours, theirs)
            for what, ours, theirs in (
                ("bos", tokens.bos_id, llama.token_bos()),
                ("eos", tokens.eos_id, llama.token_eos()),
                ("eog", tokens.eog_ids, eog),
                ("size", len(tokens), llama.n_vocab()),
            )
            if (ours if ours is not None else -1) != theirs
        ]
        for special in (False, True):
            for add_bos in (False, True):
                for text in samples:
                    want = llama.tokenize(
                        text.encode("utf-8"), add_bos=add_bos, special=special
                    )
                    got = tokens.tokenize(text, add_bos=add_bos, special=special)
                    if got != want:
                        differ.append((text, special, add_bos, got, want))
            pieces = llama_pieces(llama, special=special)
            differ += [
                (token, special, tokens.token_bytes(token, special=special), piece)
                for token, piece in enumerate(pieces)
                if tokens.token_bytes(token, special=special) != piece
            ]
        return differ
    finally:
        llama.close()


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_it_tokenizes_as_llama_cpp_does(vectors, name) -> None:
    """300 varied texts (scripts, emoji, white-space runs, control characters,
    special tokens' text), 4 ways each, and every id's bytes."""
    assert agreement(vocab_path(vectors, name), texts()) == []
