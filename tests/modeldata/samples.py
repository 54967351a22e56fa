"""Varied texts to tokenize: scripts, emoji, white-space runs, digits, code,
special tokens' text, control characters. Deterministic (a seeded shuffle)."""

from __future__ import annotations

import random

# fmt: off
PIECES = (
    "Hello", " world", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t\n",
    "Äpfel", "naïve", "façade", "Straße", "ÆØÅ", "İstanbul", "ﬁ", "Ω", "K",
    "нещо на Български", "日本語のテキスト", "我想在apple工作1314151天～",
    "한국어 문장", "العربية", "עברית", "हिन्दी", "ภาษาไทย", "កាន់តែពិសេស",
    "🦙", "🚀 (normal) 😶‍🌫️", "👨‍👩‍👧‍👦", "✅", "🇫🇷",
    "3", "33", "333", "3333", "1,234.56", "٣٤٥", "½", "²",
    "don't", "I'M", "we'll", "it's", "'s", "''",
    "def f(x):\n    return x**2", "<div class=\"a\">", "a->b", "x == y != z",
    "!!!", "...", "?!", "---", "___", "$100", "#tag", "@user", "~/path",
    "\u00a0", "\u2003", "\u3000", "\u200b", "\u0085", "\x0b", "\x0c", "\x1f", "\x00",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>",
    "<|eot_id|>", "<|begin_of_text|>", "<start_of_turn>", "<|user|>",
    "<|assistant|>", "<|end|>", "<fim_prefix>", "<eos>", "<bos>", "<pad>",
    "▁", "▁▁", "<0x0A>", "Ġ", "ĊĊ",
)
# fmt: on


def texts(count: int = 300, seed: int = 31) -> list[str]:
    """``count`` texts: every piece alone, then random joins of 2 to 8."""
    rng = random.Random(seed)
    out = list(PIECES)
    while len(out) < count:
        out.append("".join(rng.choice(PIECES) for _ in range(rng.randint(2, 8))))
    return out[:count]
