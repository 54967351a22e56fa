"""A GGUF model file's identity, sizes, vocabulary and chat template.

Read with the ``gguf`` package (llama.cpp's own reader), without loading the
weights: ``model_file_read(path)`` gives a ``ModelFile``; its ``vocab``
(``VocabData``: tokenizer and chat template) serializes to compact JSON
(``VocabData.to_json`` / ``VocabData.from_json``) so that a catalog can keep it
without the weights. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import gguf

CHUNK_BYTES = 1 << 20
"""Bytes read at a time while hashing a file (1 MiB)."""

VOCAB_FORMAT = 1
"""Version of ``VocabData``'s JSON shape (``format`` key)."""


class ModelFileError(ValueError):
    """The file is not a GGUF file, or lacks what a model needs (a vocabulary)."""


@dataclass(frozen=True)
class VocabData:
    """A model's tokenizer and chat template as its GGUF metadata holds them.

    Values are the file's own (``None`` where a key is absent); the rules
    llama.cpp applies on top of them (defaults per tokenizer type, special
    tokens found by their text) live in ``modeldata.vocab``.

    - ``model``: ``tokenizer.ggml.model`` ("gpt2": byte-level BPE, "llama":
      SentencePiece BPE with scores, "gemma4", "bert", "t5", ...).
    - ``pre``: ``tokenizer.ggml.pre``, the pre-tokenizer's name ("" if absent).
    - ``name``: ``general.name`` (llama.cpp keys one rule on it: Phi-3).
    - ``tokens``: each token's text, by id; ``token_types``: llama.cpp's token
      types by id (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
      6 byte); ``scores``: SentencePiece scores by id (empty if absent);
      ``merges``: BPE merges, "left right", best first (empty if absent).
    - ``*_id``: special token ids; ``fim_ids``: the fill-in-the-middle tokens'
      (prefix, suffix, middle, pad, repo, file separator); ``add_bos``, ``add_eos``,
      ``add_space_prefix``: the file's flags.
    - ``chat_template``: the Jinja source ("" if absent).
    """

    model: str
    pre: str
    name: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...]
    merges: tuple[str, ...]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    unk_id: int | None
    sep_id: int | None
    pad_id: int | None
    fim_ids: tuple[int | None, ...]
    add_bos: bool | None
    add_eos: bool | None
    add_space_prefix: bool | None
    chat_template: str

    def token_text(self, token: int | None) -> str:
        """The text of token ``token`` as the file spells it ("" for ``None`` or
        an id outside the vocabulary): BOS and EOS as a chat template prints them."""
        if token is None or not 0 <= token < len(self.tokens):
            return ""
        return self.tokens[token]

    def to_json(self) -> str:
        """Compact JSON of this vocabulary (UTF-8 text; about 1.3 MB for
        SmolLM2's 49,152 tokens and 48,900 merges)."""
        data = asdict(self)
        data["format"] = VOCAB_FORMAT
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> VocabData:
        """The ``VocabData`` that ``to_json`` wrote.

        Raises ``ModelFileError`` for another format version or missing keys.
        """
        data = json.loads(text)
        if data.get("format") != VOCAB_FORMAT:
            raise ModelFileError(f"vocabulary format {data.get('format')!r}")
        try:
            values = {f.name: data[f.name] for f in fields(cls)}
        except KeyError as exc:
            raise ModelFileError(f"vocabulary without {exc}") from exc
        for key in ("tokens", "token_types", "scores", "merges", "fim_ids"):
            values[key] = tuple(values[key])
        return cls(**values)


@dataclass(frozen=True)
class ModelFile:
    """What a GGUF model file is, without its weights.

    - ``sha256``: hex digest of the whole file; ``size_bytes``: its size.
    - ``architecture``: ``general.architecture`` ("llama", "qwen2", ...).
    - ``name``: ``general.name``; ``family``: ``general.basename``, else the
      name, else the architecture.
    - ``quantization``: the file type as llama.cpp names it ("Q4_1", "Q8_0",
      "F16", "Q4_K_M", ...), from ``general.file_type`` or, without it, the
      type most weight bytes have.
    - ``context_length``: tokens the model was trained for (``None`` if absent).
    - ``parameters``: number of weights (sum of the tensors' elements);
      ``weights_bytes``: bytes of tensor data (a lower bound of the VRAM the
      weights take).
    - ``vocab``: the tokenizer and chat template (``VocabData``).
    """

    sha256: str
    size_bytes: int
    architecture: str
    name: str
    family: str
    quantization: str
    context_length: int | None
    parameters: int
    weights_bytes: int
    vocab: VocabData


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of the file at ``path``, read in 1 MiB chunks.

    Raises ``OSError`` when it cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def model_file_read(path: str | Path) -> ModelFile:
    """Read the GGUF file at ``path``: metadata, tensor sizes and digest.

    Hashing reads the whole file (about 1 s per GB); the metadata takes about
    1 s for SmolLM2 and 10 s for a 128k-token vocabulary with 280k merges.
    Raises ``ModelFileError`` for a file that is not GGUF or has no
    vocabulary, ``OSError`` when it cannot be read.
    """
    reader = _reader(path)
    metadata = _metadata(reader)
    architecture = str(metadata.get("general.architecture", ""))
    name = str(metadata.get("general.name", ""))
    context = metadata.get(f"{architecture}.context_length")
    return ModelFile(
        sha256=file_sha256(path),
        size_bytes=Path(path).stat().st_size,
        architecture=architecture,
        name=name,
        family=str(metadata.get("general.basename") or name or architecture),
        quantization=_quantization(reader, metadata.get("general.file_type")),
        context_length=int(context) if context is not None else None,
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        weights_bytes=sum(int(t.n_bytes) for t in reader.tensors),
        vocab=_vocab_data(metadata),
    )


def vocab_data_read(path: str | Path) -> VocabData:
    """The tokenizer and chat template of the GGUF file at ``path`` (no digest).

    Raises like ``model_file_read``.
    """
    return _vocab_data(_metadata(_reader(path)))


def _reader(path: str | Path) -> gguf.GGUFReader:
    try:
        return gguf.GGUFReader(path)
    except (ValueError, AssertionError, IndexError) as exc:
        raise ModelFileError(f"{path}: not a GGUF file ({exc})") from exc


def _metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Every key/value of the file (arrays as lists, strings decoded)."""
    return {
        key: field.contents()
        for key, field in reader.fields.items()
        if not key.startswith("GGUF.")
    }


def _vocab_data(metadata: dict[str, Any]) -> VocabData:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelFileError("the file has no vocabulary (tokenizer.ggml.tokens)")

    def optional_int(key: str) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{key}")
        return int(value) if value is not None else None

    def optional_bool(key: str) -> bool | None:
        value = metadata.get(f"tokenizer.ggml.{key}")
        return bool(value) if value is not None else None

    return VocabData(
        model=str(metadata.get("tokenizer.ggml.model", "")),
        pre=str(metadata.get("tokenizer.ggml.pre", "")),
        name=str(metadata.get("general.name", "")),
        tokens=tuple(tokens),
        token_types=tuple(
            int(t) for t in metadata.get("tokenizer.ggml.token_type") or ()
        )
        or (1,) * len(tokens),
        scores=tuple(float(s) for s in metadata.get("tokenizer.ggml.scores") or ()),
        merges=tuple(metadata.get("tokenizer.ggml.merges") or ()),
        bos_id=optional_int("bos_token_id"),
        eos_id=optional_int("eos_token_id"),
        eot_id=optional_int("eot_token_id"),
        eom_id=optional_int("eom_token_id"),
        unk_id=optional_int("unknown_token_id"),
        sep_id=optional_int("seperator_token_id"),
        pad_id=optional_int("padding_token_id"),
        fim_ids=(
            _first(optional_int("fim_pre_token_id"), optional_int("prefix_token_id")),
            _first(optional_int("fim_suf_token_id"), optional_int("suffix_token_id")),
            _first(optional_int("fim_mid_token_id"), optional_int("middle_token_id")),
            optional_int("fim_pad_token_id"),
            optional_int("fim_rep_token_id"),
            optional_int("fim_sep_token_id"),
        ),
        add_bos=optional_bool("add_bos_token"),
        add_eos=optional_bool("add_eos_token"),
        add_space_prefix=optional_bool("add_space_prefix"),
        chat_template=str(metadata.get("tokenizer.chat_template", "")),
    )


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _quantization(reader: gguf.GGUFReader, file_type: Any) -> str:
    """llama.cpp's name of the file type ("Q4_1"); without ``general.file_type``,
    the tensor type holding the most bytes ("Q8_0")."""
    if file_type is not None:
        try:
            name = gguf.LlamaFileType(int(file_type)).name
        except ValueError:
            return f"type {int(file_type)}"
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    weight: dict[str, int] = {}
    for tensor in reader.tensors:
        kind = gguf.GGMLQuantizationType(tensor.tensor_type).name
        weight[kind] = weight.get(kind, 0) + int(tensor.n_bytes)
    return max(weight, key=weight.__getitem__) if weight else ""
