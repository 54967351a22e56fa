"""Stop sequences, token healing and GGUF metadata, without running the model."""

from __future__ import annotations

import numpy as np

import pytest

from agent.engines.decoding import (
    HealDiverged,
    HeldTokens,
    TextHealer,
    TokenHealer,
    heal_split,
    stop_scan,
    text_heal_split,
)
from agent.engines.gguf import gguf_chat_template
from agent.engines.llamacpp import smollm2_gguf_path

pytestmark = []


def test_stop_scan_cuts_at_the_first_stop_sequence() -> None:
    assert stop_scan("Hello. World.", ["."]) == ("Hello", "", True)
    assert stop_scan("a END b STOP", ["STOP", "END"]) == ("a ", "", True)


def test_stop_scan_holds_back_a_possible_start_of_a_stop_sequence() -> None:
    assert stop_scan("Hello EN", ["END"]) == ("Hello ", "EN", False)
    assert stop_scan("Hello", ["END"]) == ("Hello", "", False)
    assert stop_scan("Hello", []) == ("Hello", "", False)


PIECES = [b"", b" s", b" sea", b" se", b"a", b"The", b" sun", b"x"]


def test_heal_split_drops_the_tokens_of_the_last_word_inside_the_prefix() -> None:
    # prompt "...The s": tokens [The][ s]; " s" starts a word: only it is dropped
    assert heal_split([7, 5, 1], PIECES, "The s") == ([7, 5], b" s")
    # " se" + "a": both dropped, up to the word start
    assert heal_split([7, 5, 3, 4], PIECES, "The sea") == ([7, 5], b" sea")


def test_heal_split_heals_nothing_without_a_prefix_or_outside_it() -> None:
    assert heal_split([7, 5, 1], PIECES, "") == ([7, 5, 1], b"")
    assert heal_split([7, 5, 1], PIECES, "s") == (
        [7, 5, 1],
        b"",
    )  # " s" reaches before it
    assert heal_split([7, 0], PIECES, "x") == ([7, 0], b"")  # special token


def test_token_healer_only_allows_tokens_agreeing_with_the_healed_bytes() -> None:
    healer = TokenHealer(PIECES, b" s")
    scores = np.zeros(len(PIECES), dtype=np.float32)
    allowed = np.isfinite(healer(None, scores))
    assert [PIECES[i] for i in np.flatnonzero(allowed)] == [
        b" s",
        b" sea",
        b" se",
        b" sun",
    ]
    assert healer.feed(b" sea") == b"ea"
    assert healer.remaining == b""
    assert healer(None, scores) is scores  # healed: no constraint any more
    assert healer.feed(b"x") == b"x"


def test_token_healer_follows_a_heal_spread_over_several_tokens() -> None:
    healer = TokenHealer(PIECES, b" sea")
    assert healer.feed(b" se") == b""
    assert healer.remaining == b"a"
    assert healer.feed(b"a") == b""
    assert healer.feed(b"x") == b"x"


def test_it_reads_the_chat_template_from_the_gguf_file() -> None:
    path = smollm2_gguf_path()
    assert path is not None
    template, bos, eos = gguf_chat_template(path)
    assert bos != eos
    assert "<|im_start|>" in template
    assert eos == "<|im_end|>"


def test_held_tokens_past_a_stop_sequence_are_not_reported() -> None:
    held = HeldTokens()
    for chars in (1, 1):  # "4" then ","; the stop "," hits on the second
        held.add(chars)
    assert held.unsent(1) == 1, "only '4' reached the renter"
    held = HeldTokens()
    for chars in (
        2,
        1,
        0,
        1,
    ):  # "ab", "," held, part of a character, " " completes ", "
        held.add(chars)
    held.consume(2)  # "ab" was sent before the stop was known
    assert held.unsent(0) == 3
    held = HeldTokens()
    held.add(3)  # one token "a, " carrying the stop ", " after its first character
    assert held.unsent(1) == 0, "the token's 'a' was sent: it counts"
    # one token "\n" + 12 spaces; its last space held (it may start " the"),
    # the rest sent, then generation ends: the token counts (found by the
    # property test: 13 characters reported as 0 tokens, the count flagged)
    held = HeldTokens()
    held.add(13)
    held.consume(12)
    assert held.unsent(0) == 0, "part of the token was sent: it counts"
    held.add(2)
    assert held.unsent(0) == 1, "a later held token that sent nothing does not"


@pytest.mark.parametrize(
    "prefix, split",
    [
        ("The s", ("The", " s")),
        ("The sea", ("The", " sea")),
        ("Hi, ", ("Hi,", " ")),
        ("beauty,\n\n", ("beauty,", "\n\n")),
        ("x = (ab", ("x = (", "ab")),
        ("Hel", ("", "Hel")),  # one short word: healed whole
        ("", ("", "")),
        ("Hello,", ("Hello,", "")),  # ends in punctuation: sent as is
        ("see " + "a" * 40, ("see " + "a" * 40, "")),  # a last word too long
    ],
)
def test_text_heal_split_cuts_back_to_where_the_last_word_begins(prefix, split):
    assert text_heal_split(prefix) == split
    assert "".join(split) == prefix


def test_the_text_healer_passes_on_only_what_follows_the_tail() -> None:
    healer = TextHealer(" momen")
    assert healer.feed(" mom") == "" and healer.healing
    assert healer.feed("ent") == "t" and not healer.healing
    assert healer.feed(" of") == " of"
    with pytest.raises(HealDiverged):
        TextHealer(" s").feed(" ocean")
