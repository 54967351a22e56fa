"""A model's tokenizer, rebuilt from its GGUF vocabulary the way llama.cpp runs it.

``Vocabulary(data)`` tokenizes as ``llama_tokenize`` does (same ids, checked
against llama.cpp's own test vectors and against llama-cpp-python) and maps ids
back to their bytes as ``llama_token_to_piece`` does. Supported
``tokenizer.ggml.model`` values: "gpt2" (byte-level BPE, with the
pre-tokenizers of ``modeldata.pretokenize``), "gemma4" (BPE over "▁"-escaped
UTF-8) and "llama" (SentencePiece BPE by scores, ``modeldata.spm``). Others
("bert", "t5", "rwkv", ...) raise ``UnsupportedVocabulary``.

The special-token rules follow ``llama-vocab.cpp``: control, user-defined and
unknown tokens are cut out of the text first, longest first (with ``special``
false only user-defined ones: control tokens' text is then ordinary text), and
the tokens llama.cpp recognises by their text (``<|im_end|>``, ``</s>``, ...)
count as control tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from modeldata.modelfile import VocabData
from modeldata.pretokenize import PRE_TOKENIZERS, PreTokenizer
from modeldata.spm import spm_tokenize

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
"""llama.cpp's token types (``tokenizer.ggml.token_type``)."""

_EOG_TEXTS = frozenset(
    ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>")
    + ("<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>")
    + ("_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>")
    + ("<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>")
)
"""Texts llama.cpp makes end-of-generation, hence control, tokens."""

_EOT_TEXTS = (
    ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
    + ("<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>")
    + ("<end_of_utterance>",)
)
_FIM_TEXTS = (
    ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>")
    + ("▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>")
    + ("▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>")
    + ("▁<MID>", "<|code_middle|>", "<|middle|>"),
    ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)
"""Texts llama.cpp takes, when the file names none, for EOT and each FIM token:
the one it picks becomes a control token (here: the lowest id of each list)."""

_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
_C_SPACES = " \t\n\v\f\r"


class UnsupportedVocabulary(ValueError):
    """A tokenizer type or pre-tokenizer llama.cpp has and this package lacks."""


class Vocabulary:
    """llama.cpp's tokenizer for one model, built from its ``VocabData``.

    Resolved as llama.cpp resolves them: ``bos_id``, ``eos_id``, ``eot_id``
    (``None`` where the model has none; among several EOT-looking tokens
    llama.cpp takes one in hash order, this the lowest id), ``eog_ids`` (the
    tokens that end a generation), ``add_bos`` / ``add_eos`` (what
    ``tokenize(add_bos=True)`` adds). ``tokens``: each id's text; ``len()``:
    the vocabulary's size.

    Building takes about 0.2 s for SmolLM2 (49k tokens), up to 15 s for a
    262k-token vocabulary. Thread-safe once built. Raises
    ``UnsupportedVocabulary`` for a type or pre-tokenizer it does not run.
    """

    def __init__(self, data: VocabData) -> None:
        self.data = data
        self.kind = {"gpt2": "bpe", "gemma4": "bpe", "llama": "spm"}.get(data.model)
        if self.kind is None:
            raise UnsupportedVocabulary(f"tokenizer model {data.model!r}")
        pre = "gemma4" if data.model == "gemma4" else data.pre
        self.pre: PreTokenizer | None = None
        if self.kind == "bpe":
            self.pre = PRE_TOKENIZERS.get(pre)
            if self.pre is None:
                raise UnsupportedVocabulary(f"pre-tokenizer {pre!r}")
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(data.tokens)]
        self.token_ids = {text: i for i, text in enumerate(tokens)}
        self.types = list(data.token_types)
        self.scores = list(data.scores) or [0.0] * len(tokens)
        self._special_ids(len(tokens))
        self._mark_control(tokens)
        self._specials = sorted(
            (
                i
                for i, t in enumerate(self.types)
                if t in (CONTROL, USER_DEFINED, UNKNOWN)
            ),
            key=lambda i: -len(tokens[i].encode("utf-8")),
        )
        self._rstrip = self._phi3_rstrip(tokens)
        self.tokens = tokens
        self._pieces = [self._piece(i) for i in range(len(tokens))]
        self._bpe = self._bpe_build() if self.kind == "bpe" else None

    # -- the special tokens ---------------------------------------------------

    def _special_ids(self, size: int) -> None:
        """llama.cpp's defaults per type, overridden by the file's ids in range."""
        data = self.data
        spm = self.kind == "spm"
        gemma4 = data.model == "gemma4"
        defaults = {
            "bos": 1 if spm else (None if gemma4 else 11),
            "eos": 2 if spm else (None if gemma4 else 11),
            "unk": 0 if spm else None,
        }
        given = {"bos": data.bos_id, "eos": data.eos_id, "unk": data.unk_id}
        ids: dict[str, int | None] = {}
        for key, default in defaults.items():
            value = given[key]
            if value is not None and 0 <= value < size:
                ids[key] = value
            else:
                ids[key] = default if default is not None and default < size else None
        if data.pre in ("chatglm-bpe", "glm4", "glm5") and data.bos_id is None:
            ids["bos"] = None
        self.bos_id, self.eos_id, self.unk_id = ids["bos"], ids["eos"], ids["unk"]
        pre_add_bos = self.pre.add_bos if self.pre else True
        self.add_bos = pre_add_bos if data.add_bos is None else data.add_bos
        if data.model == "gemma4":
            self.add_bos = True
        self.add_eos = bool(data.add_eos)
        self.add_space_prefix = (
            spm if data.add_space_prefix is None else data.add_space_prefix
        )

    def _mark_control(self, tokens: list[str]) -> None:
        """The token types llama.cpp corrects from the tokens' text."""
        data = self.data

        def given(token: int | None) -> int | None:
            return token if token is not None and 0 <= token < len(tokens) else None

        searched = [
            (data.eot_id, _EOT_TEXTS),
            (data.eom_id, ("<|eom_id|>",)),
            *zip(data.fim_ids, _FIM_TEXTS, strict=True),
        ]
        eog = {self.eos_id}
        for index, (token, texts) in enumerate(searched):
            token = given(token)
            found = [self.token_ids[t] for t in texts if t in self.token_ids]
            if token is None and found:
                token = min(found)
                self._control(token)
            if index == 0:
                self.eot_id = token
            if index in (0, 1, 5, 6, 7):  # EOT, EOM, FIM pad, repo, separator
                eog.add(token)
        for text in _EOG_TEXTS & self.token_ids.keys():
            self._control(self.token_ids[text])
            eog.add(self.token_ids[text])
        for text in _ALWAYS_RENDERED:
            if text in self.token_ids:
                self.types[self.token_ids[text]] = USER_DEFINED
        present = {tokens[i] for i in eog if i is not None}
        if "<|end|>" in present and (
            {"<|return|>", "<|call|>"} <= present
            or ("<|flush|>" in present and present & {"<|call|>", "<|calls|>"})
        ):
            self.types[self.token_ids["<|end|>"]] = USER_DEFINED
            eog.discard(self.token_ids["<|end|>"])
        if "</s>" in present and present & {"<|tool_response>", "<|plamo:eos|>"}:
            self.types[self.token_ids["</s>"]] = NORMAL
            eog.discard(self.token_ids["</s>"])
        self.eog_ids = frozenset(eog - {None})

    def _control(self, token: int) -> None:
        if self.types[token] not in (CONTROL, UNKNOWN):
            self.types[token] = CONTROL

    def _phi3_rstrip(self, tokens: list[str]) -> frozenset[int]:
        """Phi-3's special tokens eat the white space after them (llama.cpp
        keys this on ``general.name``)."""
        name = self.data.name.lower()
        if "phi-3" not in name and "phi3" not in name:
            return frozenset()
        strip = set(self._specials) | {self.token_ids.get("</s>", -1)}
        strip -= {self.token_ids.get(t, -1) for t in ("<unk>", "<s>", "<|endoftext|>")}
        return frozenset(strip - {-1})

    # -- tokenizing -----------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        """Token ids of ``text``, as ``llama_tokenize(text, add_special=add_bos,
        parse_special=special)``: with ``add_bos``, BOS (and EOS) where the
        model adds them; with ``special``, the text of control tokens becomes
        those tokens (user-defined tokens always do).

        Raises ``KeyError`` when an SPM model lacks a byte's token.
        """
        output: list[int] = []
        if add_bos and self.add_bos and self.bos_id is not None:
            output.append(self.bos_id)
        fragments = self._partition(text, special) if text else []
        if self.kind == "spm":
            previous_special = True
            for fragment in fragments:
                if isinstance(fragment, int):
                    output.append(fragment)
                    previous_special = True
                    continue
                if self.add_space_prefix and previous_special:
                    fragment = " " + fragment
                output += spm_tokenize(
                    fragment.replace(" ", "▁"),
                    self.token_ids,
                    self.scores,
                    self._byte_token,
                )
                previous_special = False
        else:
            for fragment in fragments:
                if isinstance(fragment, int):
                    output.append(fragment)
                else:
                    output += self._bpe.encode(fragment, add_special_tokens=False).ids
        if add_bos and self.add_eos and self.eos_id is not None:
            output.append(self.eos_id)
        return output

    def _partition(self, text: str, special: bool) -> list[str | int]:
        """``text`` cut around special tokens as llama.cpp's
        ``tokenizer_st_partition``: token ids, and text fragments between."""
        fragments: list[str | int] = [text]
        for token in self._specials:
            if not special and self.types[token] != USER_DEFINED:
                continue
            needle = self.tokens[token]
            if needle not in text:
                continue
            cut: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or needle not in fragment:
                    cut.append(fragment)
                    continue
                parts = fragment.split(needle)
                for index, part in enumerate(parts):
                    if index:
                        cut.append(token)
                        if token in self._rstrip:
                            part = part.lstrip(_C_SPACES)
                    if part:
                        cut.append(part)
            fragments = cut
        return fragments

    def _byte_token(self, byte: int) -> int:
        token = self.token_ids.get(f"<0x{byte:02X}>")
        if token is None:
            token = self.token_ids[chr(byte)]
        return token

    def _bpe_build(self) -> Tokenizer:
        """HF ``tokenizers``' BPE over this vocabulary, after llama.cpp's
        pre-tokenizer (merges whose parts or result are not tokens are left out:
        HF refuses them)."""
        assert self.pre is not None
        merges = []
        for merge in self.data.merges:
            cut = merge.find(" ", 1)
            left, right = merge[:cut], merge[cut + 1 :]
            if cut > 0 and {left, right, left + right} <= self.token_ids.keys():
                merges.append((left, right))
        vocab = dict(self.token_ids)
        tokenizer = Tokenizer(
            models.BPE(
                vocab=vocab,
                merges=merges,
                ignore_merges=self.pre.ignore_merges,
                byte_fallback=not self.pre.byte_encode,
            )
        )
        steps = [
            pre_tokenizers.Split(Regex(regex), behavior="isolated")
            for regex in self.pre.regexes
        ]
        if self.pre.byte_encode:
            steps.append(
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
            )
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
        if self.pre.escape_spaces:
            tokenizer.normalizer = normalizers.Replace(" ", "▁")
        return tokenizer

    # -- ids to bytes -----------------------------------------------------------

    def _piece(self, token: int) -> bytes:
        """``llama_token_to_piece(token, special=True)``."""
        text, kind = self.tokens[token], self.types[token]
        if kind in (CONTROL, UNKNOWN, USER_DEFINED):
            return text.encode("utf-8")
        if kind == NORMAL:
            if self.kind == "spm" or (self.pre and self.pre.escape_spaces):
                return text.replace("▁", " ").encode("utf-8")
            return _byte_decode(text)
        if kind == BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def token_bytes(self, token: int, *, special: bool = True) -> bytes:
        """The bytes token ``token`` stands for (``llama_token_to_piece``);
        control and unknown tokens give ``b""`` unless ``special``.

        Raises ``IndexError`` for an id outside the vocabulary.
        """
        if token < 0:
            raise IndexError(token)
        if not special and self.types[token] in (CONTROL, UNKNOWN):
            return b""
        return self._pieces[token]

    def detokenize(self, tokens: Iterable[int], *, special: bool = False) -> bytes:
        """The bytes of ``tokens`` joined (each as ``token_bytes``)."""
        return b"".join(self.token_bytes(t, special=special) for t in tokens)

    def __len__(self) -> int:
        return len(self.tokens)


def _byte_table() -> dict[str, int]:
    """GPT-2's printable character for each byte, reversed."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {chr(b): b for b in printable}
    extra = 0
    for byte in range(256):
        if byte not in printable:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


_BYTES = _byte_table()


def _byte_decode(text: str) -> bytes:
    """A byte-level BPE token's bytes; a character outside GPT-2's table gives
    llama.cpp's ``[UNK_BYTE_0x..]`` marker."""
    out = bytearray()
    for char in text:
        byte = _BYTES.get(char)
        if byte is None:
            out += f"[UNK_BYTE_0x{char.encode('utf-8').hex()}{text}]".encode()
        else:
            out.append(byte)
    return bytes(out)
