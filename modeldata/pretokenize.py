"""llama.cpp's BPE pre-tokenizers: how a text is cut into words before merging.

Each ``tokenizer.ggml.pre`` name maps to a ``PreTokenizer``: the regular
expressions llama.cpp applies in turn (each one cuts every piece so far into
its matches and the text between them), whether words are byte-encoded the
GPT-2 way, whether spaces become "▁" first, and whether a word found whole in
the vocabulary skips the merges (``ignore_merges``). The expressions are
llama.cpp's own (``llama-vocab.cpp``, ``llm_tokenizer_bpe``), written for
Oniguruma (HF ``tokenizers``): ``\\p{L}``, ``\\p{N}`` and ``\\s`` mean what
llama.cpp's Unicode tables mean, and ``$`` is written ``\\z`` (end of piece).
"""

from __future__ import annotations

from dataclasses import dataclass

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_LETTERS = (  # escaped: an editor's Unicode normalization would change it
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
    "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    + _CONTRACTIONS
    + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp cuts text into words for one ``tokenizer.ggml.pre``.

    ``regexes``: applied in turn, each cutting every piece into matches and
    gaps; ``byte_encode``: words are mapped byte by byte to GPT-2's printable
    characters (else raw UTF-8 with ``<0xXX>`` byte tokens); ``escape_spaces``:
    " " becomes "▁" first; ``ignore_merges``: a word that is a token is that
    token; ``add_bos``: llama.cpp's default for adding BOS (the file's
    ``add_bos_token`` overrides it, except for Gemma 4 where it is forced).
    """

    regexes: tuple[str, ...]
    byte_encode: bool = True
    escape_spaces: bool = False
    ignore_merges: bool = False
    add_bos: bool = False


DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
LLAMA3 = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
GPT2 = PreTokenizer((_GPT2,))
STARCODER = PreTokenizer((r"\p{N}", _GPT2))
QWEN2 = PreTokenizer((_QWEN2,))

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": DEFAULT,
    "": DEFAULT,
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral")
        + ("midm-2.0", "lfm2", "jina-v5-nano"),
        LLAMA3,
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), PreTokenizer((_LLAMA3,))),
    "chatglm-bpe": PreTokenizer((_LLAMA3,)),
    **dict.fromkeys(("glm4", "glm5"), PreTokenizer((_LLAMA3,), ignore_merges=True)),
    "deepseek-llm": PreTokenizer(
        (
            "[\r\n]",
            rf"\s?[{_DEEPSEEK_LETTERS}]+",
            "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
            r"\s+\z",
            _CJK,
            r"\p{N}+",
        )
    ),
    "deepseek-coder": PreTokenizer(
        ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
    ),
    "deepseek-v3": PreTokenizer(
        (
            r"\p{N}{1,3}",
            "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
            r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
            r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        )
    ),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone")
        + ("minerva-7b", "mellum2"),
        STARCODER,
    ),
    **dict.fromkeys(
        ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es")
        + ("jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo")
        + ("jais", "trillion", "granite-docling", "exaone4", "jina-v1-en")
        + ("jina-v2-code", "roberta-bpe"),
        GPT2,
    ),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez")
        + ("hunyuan", "solar-open", "grok-2"),
        QWEN2,
    ),
    "qwen35": PreTokenizer((_QWEN35,)),
    **dict.fromkeys(
        ("poro-chat", "bloom", "gpt3-finnish"),
        PreTokenizer((_BLOOM,)),
    ),
    "viking": PreTokenizer((_BLOOM, r"\p{N}")),
    "tekken": PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    **dict.fromkeys(
        ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
        PreTokenizer((_GPT4O,)),
    ),
    "seed-coder": PreTokenizer(
        (
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}"
            r"| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
        )
    ),
    **dict.fromkeys(
        ("bailingmoe", "bailingmoe2", "llada-moe"),
        PreTokenizer(
            (
                r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
            )
        ),
    ),
    "gemma4": PreTokenizer(
        (r"[^\n]+|[\n]+",), byte_encode=False, escape_spaces=True, add_bos=True
    ),
}
"""Pre-tokenizers by ``tokenizer.ggml.pre``; a name missing here is one llama.cpp
knows and this package does not (``Vocabulary`` refuses it)."""
